/*
 * The real libc functions behind the interposed ones (real_<name>, one for each entry of
 * REAL_FUNCTIONS in preload.h), found with dlsym(RTLD_NEXT) when the library is loaded, and
 * the thread-local flag that sends the library's own calls straight to them.
 */
#include "preload.h"

#define DEFINE_REAL(ret, name, args, fallback) ret(*real_##name) args;
REAL_FUNCTIONS(DEFINE_REAL)
#undef DEFINE_REAL

__thread int t_in_lib __attribute__((tls_model("initial-exec")));

void *resolve(const char *name, const char *fallback) {
    t_in_lib++;
    void *f = dlsym(RTLD_NEXT, name);
    if (!f && fallback)
        f = dlsym(RTLD_NEXT, fallback);
    t_in_lib--;
    return f;
}

__attribute__((constructor)) static void resolve_all(void) {
#define RESOLVE_REAL(ret, name, args, fallback) RESOLVE(name, fallback);
    REAL_FUNCTIONS(RESOLVE_REAL)
#undef RESOLVE_REAL
}
