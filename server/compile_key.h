/* The inputs of an executable's cache key besides the module: the resolved
 * target and the canonical text of the options that change code.
 *
 * kilnd computes keys with these, and so does `kiln cache explain` for
 * module files (it compiles server/compile_key.c into the command), so a
 * key computed locally is the key a server would give the same request.
 * Nothing here depends on gRPC.
 */
#ifndef KILN_SERVER_COMPILE_KEY_H
#define KILN_SERVER_COMPILE_KEY_H

#include <stddef.h>
#include <stdint.h>

#define KILND_KEY_TEXT_MAX 96

/* The target component for a cpu kiln_target name ("cpu", "cpu-x86-64-v3";
 * NULL means "cpu"): the ISA level as given ("x86-64-v3"), or for "cpu"
 * (cc -march=native) "native-" and 16 hex digits of this machine's CPU
 * model and feature flags, so that machines whose native code differs
 * never share an entry. */
void kilnd_key_target(const char *target_name, char out[KILND_KEY_TEXT_MAX]);

/* The options component: "opt=N\ndevices=N\n". Transforms are not in it:
 * they are applied before the module is hashed. Diagnostics (dumps,
 * verify_each_pass), return_executable, request_id and cache_policy never
 * change code and are left out. */
void kilnd_key_options(int opt_level, uint32_t ndevices, char out[KILND_KEY_TEXT_MAX]);

#endif /* KILN_SERVER_COMPILE_KEY_H */
