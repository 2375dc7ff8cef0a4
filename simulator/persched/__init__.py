"""PerSched against the online bandwidth-sharing strategies ([PERSCHED], docs/persched.md):
``compare`` runs both on the same application sets."""
