# shellcheck shell=bash
# Shared by burstctl-prolog and burstctl-epilog (sourced, not run): configuration, logging,
# and one bounded call of `burstctl job ...` per controller replica.
#
# Configuration, first found wins: the environment, then /etc/burstctl/slurm.env (another file
# with BURSTCTL_SLURM_ENV). Only BURSTCTL_* lines of that file are read; it is never executed.
#   BURSTCTL_URLS               REST addresses of every replica, comma or space separated
#                               (default: BURSTCTL_URL, else http://127.0.0.1:8080)
#   BURSTCTL_ADMIN_TOKEN_FILE   file holding the bearer token (or BURSTCTL_ADMIN_TOKEN)
#   BURSTCTL_BIN                the burstctl executable (default: burstctl on PATH, else
#                               /opt/burstctl/.venv/bin/burstctl)
#   BURSTCTL_SLURM_TIMEOUT      seconds one call may take before it is killed (default 5)
#   BURSTCTL_SLURM_GROUP        gid (default): the job's group name; account: its account
#   BURSTCTL_SLURM_SYSLOG       1 (default): also log to syslog with logger(1); 0: stderr only
#   BURSTCTL_APP                the application name of the job's profile (placement advice;
#                               default: SLURM_JOB_NAME when it is a plain identifier)
#   BURSTCTL_ALLOCATOR          allocator asked for in the placement advice (default: by the
#                               job's information level); BURSTCTL_PLACEMENT likewise
#
# Nothing here may fail the job: every problem is logged and the scripts exit 0.

# Slurm runs prologs and epilogs without a search path.
PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH

burstctl_log() { # burstctl_log PRIORITY MESSAGE...
  local priority=$1
  shift
  printf '%s[%s]: %s\n' "$BURSTCTL_SLURM_TAG" "$$" "$*" >&2
  if [ "${BURSTCTL_SLURM_SYSLOG:-1}" != 0 ] && command -v logger >/dev/null 2>&1; then
    logger -t "$BURSTCTL_SLURM_TAG" -p "user.$priority" -- "$*" 2>/dev/null || true
  fi
}

burstctl_load_env() { # KEY=VALUE lines; keys already in the environment win
  local file=${BURSTCTL_SLURM_ENV:-/etc/burstctl/slurm.env} line key value
  [ -r "$file" ] || return 0
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line#"${line%%[![:space:]]*}"}
    case $line in '' | '#'*) continue ;; esac
    line=${line#export }
    key=${line%%=*}
    value=${line#*=}
    [[ $key =~ ^BURSTCTL_[A-Z0-9_]+$ ]] || continue
    [ "$key" != "$line" ] || continue
    case $value in \"*\") value=${value:1:${#value}-2} ;; \'*\') value=${value:1:${#value}-2} ;; esac
    [ -n "${!key+set}" ] || export "$key=$value"
  done <"$file"
}

burstctl_setup() {
  burstctl_load_env
  BURSTCTL_URLS=${BURSTCTL_URLS:-${BURSTCTL_URL:-http://127.0.0.1:8080}}
  BURSTCTL_SLURM_TIMEOUT=${BURSTCTL_SLURM_TIMEOUT:-5}
  if [ -z "${BURSTCTL_BIN:-}" ]; then
    BURSTCTL_BIN=$(command -v burstctl || echo /opt/burstctl/.venv/bin/burstctl)
  fi
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    burstctl_log warning "SLURM_JOB_ID is not set: nothing to do"
    exit 0
  fi
  if [ ! -x "$BURSTCTL_BIN" ]; then
    burstctl_log err "job $SLURM_JOB_ID: burstctl not found at $BURSTCTL_BIN (set BURSTCTL_BIN)"
    exit 0
  fi
}

# burstctl_call ACTION URL ARGS...: runs `burstctl job ARGS --url URL` for at most
# BURSTCTL_SLURM_TIMEOUT seconds and logs the outcome. Returns its status (124: timed out).
burstctl_call() {
  local action=$1 url=$2 out rc
  shift 2
  out=$(timeout -k 1 "$BURSTCTL_SLURM_TIMEOUT" "$BURSTCTL_BIN" job "$@" --url "$url" 2>&1) && rc=0 || rc=$?
  out=${out//$'\n'/ }
  if [ "$rc" -eq 0 ]; then
    burstctl_log info "$url: $out"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    burstctl_log err "job $SLURM_JOB_ID: $action at $url timed out after ${BURSTCTL_SLURM_TIMEOUT}s"
  elif [[ $out == *"not registered"* ]]; then
    burstctl_log notice "job $SLURM_JOB_ID: not registered at $url, nothing to $action"
  else
    burstctl_log err "job $SLURM_JOB_ID: $action at $url failed: ${out:-exit $rc}"
  fi
  return "$rc"
}

burstctl_urls() { # one URL a line
  local urls=${BURSTCTL_URLS//,/ } url
  for url in $urls; do printf '%s\n' "$url"; done
}

# burstctl_job_identity: sets nodes, user, group and app from the job's environment (the
# prolog's and the task prolog's); returns 1, logged, when user or group cannot be found.
burstctl_job_identity() {
  # p_i: SLURM_JOB_NUM_NODES (set for PrologSlurmctld and most prologs), SLURM_NNODES, else the
  # node list counted by scontrol, else 1.
  nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}
  if ! [[ $nodes =~ ^[1-9][0-9]*$ ]]; then
    nodes=
    if [ -n "${SLURM_JOB_NODELIST:-}" ] && command -v scontrol >/dev/null 2>&1; then
      nodes=$(timeout 2 scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | grep -c .)
    fi
    if ! [[ $nodes =~ ^[1-9][0-9]*$ ]]; then
      burstctl_log warning "job $SLURM_JOB_ID: no node count in the environment and none from" \
        "scontrol; registering 1 node"
      nodes=1
    fi
  fi

  user=${SLURM_JOB_USER:-}
  if [ -z "$user" ] && [ -n "${SLURM_JOB_UID:-}" ]; then
    user=$(getent passwd "$SLURM_JOB_UID" | cut -d: -f1)
    user=${user:-$SLURM_JOB_UID}
  fi

  # The group: the name of the job's gid by default, as the mounts name a caller's group;
  # BURSTCTL_SLURM_GROUP=account registers the Slurm account instead (group-fair by account).
  group=
  if [ "${BURSTCTL_SLURM_GROUP:-gid}" = account ]; then
    group=${SLURM_JOB_ACCOUNT:-}
  else
    group=${SLURM_JOB_GROUP:-}
    if [ -z "$group" ] && [ -n "${SLURM_JOB_GID:-}" ]; then
      group=$(getent group "$SLURM_JOB_GID" | cut -d: -f1)
      group=${group:-$SLURM_JOB_GID}
    fi
    group=${group:-${SLURM_JOB_ACCOUNT:-}}
  fi

  # The application of its profile: BURSTCTL_APP, else the job name if it is an identifier.
  app=${BURSTCTL_APP:-${SLURM_JOB_NAME:-}}
  if ! [[ $app =~ ^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$ ]]; then
    app=
  fi

  if [ -z "$user" ] || [ -z "$group" ]; then
    burstctl_log err "job $SLURM_JOB_ID: no user or group in the environment" \
      "(SLURM_JOB_USER/SLURM_JOB_UID, SLURM_JOB_GID/SLURM_JOB_ACCOUNT); not registered"
    return 1
  fi
}

# burstctl_advice [--export]: the placement advice for the job (POST /v1/placement through
# `burstctl placement --job`) from the first replica that answers, on stdout: the table, or
# with --export the line `export BURSTCTL_REPLICAS=host:port,...`. Needs burstctl_job_identity.
# Returns 1 (logged) when no replica answered.
burstctl_advice() {
  local url out rc args=(placement --job "$SLURM_JOB_ID" --user "$user" --group "$group"
    --nodes "$nodes")
  [ -z "$app" ] || args+=(--app "$app")
  [ -z "${BURSTCTL_ALLOCATOR:-}" ] || args+=(--allocator "$BURSTCTL_ALLOCATOR")
  [ -z "${BURSTCTL_PLACEMENT:-}" ] || args+=(--placement "$BURSTCTL_PLACEMENT")
  args+=("$@")
  while IFS= read -r url; do
    out=$(timeout -k 1 "$BURSTCTL_SLURM_TIMEOUT" "$BURSTCTL_BIN" "${args[@]}" --url "$url" \
      2>/dev/null) && rc=0 || rc=$?
    if [ "$rc" -eq 0 ] && [ -n "$out" ]; then
      printf '%s\n' "$out"
      return 0
    fi
    burstctl_log notice "job $SLURM_JOB_ID: no placement advice from $url (exit $rc)"
  done < <(burstctl_urls)
  return 1
}
