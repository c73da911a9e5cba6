/* kiln kernel register: a C kernel sent to a kilnd (RegisterKernel) for
 * programs' custom calls of kiln.user.NAME, and --user-kernel, the same
 * kernel registered in this process for a local `kiln run --backend cpu`.
 * Both run the kernel's code: on the server, or here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "compiler/codegen/user_kernel.h"

/* ---- --user-kernel NAME=FILE.c:SIGNATURE (local) ---------------------------------- */

static kiln_user_kernels *local_kernels;

static void free_local(void) {
  kiln_user_kernels_destroy(local_kernels);
  local_kernels = NULL;
}

/* The signature holds no ':' and the name no '=': the first '=' ends the
 * name, the last ':' the file. */
static int register_one(const char *cmd, const char *spec) {
  const char *eq = strchr(spec, '='), *colon = strrchr(spec, ':');
  if (eq == NULL || colon == NULL || colon < eq || eq == spec || colon == eq + 1) {
    fprintf(stderr, "kiln %s: --user-kernel needs NAME=FILE.c:SIGNATURE, not '%s'\n", cmd, spec);
    return KILN_EXIT_USAGE;
  }
  char name[KILN_USER_KERNEL_NAME_MAX + 2], path[4096];
  snprintf(name, sizeof name, "%.*s", (int)(eq - spec), spec);
  snprintf(path, sizeof path, "%.*s", (int)(colon - eq - 1), eq + 1);
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *src;
  size_t len;
  if (kiln__file_read(path, &src, &len, &st)) {
    kiln__report(path, NULL, &st);
    return kiln__exit_code(st.code);
  }
  kiln_user_kernel_options o = {.check_link = true};
  int rc = kiln_user_kernels_register(local_kernels, name, (const char *)src, len, colon + 1, &o,
                                      NULL, NULL, &st);
  kiln_free(src);
  if (rc) {
    fprintf(stderr, "%s: error: user kernel %s: %s: %s\n", path, name, st.where, st.msg);
    return kiln__exit_code(rc);
  }
  return KILN_EXIT_OK;
}

int kiln__user_kernels_parse(const kiln__args *a, const struct kiln_user_kernels **out) {
  *out = NULL;
  int n;
  const char **specs = kiln__args_all(a, "user-kernel", &n);
  if (n == 0) return KILN_EXIT_OK;
  if (local_kernels == NULL) {
    if ((local_kernels = kiln_user_kernels_create()) == NULL) return KILN_EXIT_INTERNAL;
    atexit(free_local);
  }
  for (int i = 0; i < n; i++) {
    int rc = register_one(a->cmd->name, specs[i]);
    if (rc) return rc;
  }
  *out = local_kernels;
  return KILN_EXIT_OK;
}

/* ---- kiln kernel register --server ------------------------------------------------ */

#ifdef KILN_HAVE_CLIENT

#include "clients/c/kiln.h"

static int read_text(const char *path, char **out) {
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *b;
  size_t len;
  if (kiln__file_read(path, &b, &len, &st)) {
    kiln__report(path, NULL, &st);
    return kiln__exit_code(st.code);
  }
  char *t = kiln_malloc(len + 1);
  if (t == NULL) {
    kiln_free(b);
    return KILN_EXIT_INTERNAL;
  }
  memcpy(t, b, len);
  t[len] = '\0';
  kiln_free(b);
  if (strlen(t) != len) {
    fprintf(stderr, "%s: error: the file holds a NUL byte\n", path);
    kiln_free(t);
    return KILN_EXIT_INVALID;
  }
  *out = t;
  return KILN_EXIT_OK;
}

static int kernel_register(const kiln__args *a) {
  const char *sig = kiln__args_get(a, "signature"), *cuda_path = kiln__args_get(a, "cuda");
  if (kiln__args_get(a, "server") == NULL || sig == NULL || a->npos != 3) {
    fprintf(stderr,
            "kiln kernel register: give --server HOST:PORT, NAME, FILE.c and --signature SIG\n");
    return KILN_EXIT_USAGE;
  }
  char *src = NULL, *cuda = NULL;
  int rc = read_text(a->pos[2], &src);
  if (rc == 0 && cuda_path) rc = read_text(cuda_path, &cuda);
  kiln_client *c = NULL;
  if (rc == 0) rc = kiln__remote_connect(a, &c);
  if (rc == 0) {
    kiln_status st;
    kiln_status_clear(&st);
    kiln_remote_kernel k;
    if (kiln_client_register_kernel(c, a->pos[1], src, sig, cuda, &k, &st)) {
      rc = kiln__remote_report("kiln kernel register", &st);
    } else {
      printf("registered %s %s%s\n", a->pos[1], k.digest, k.cached ? " (cached)" : "");
      if (k.cuda_check[0]) printf("cuda: %s\n", k.cuda_check);
    }
    kiln_client_close(c);
  }
  kiln_free(src);
  kiln_free(cuda);
  return rc;
}

#else /* !KILN_HAVE_CLIENT */

static int kernel_register(const kiln__args *a) {
  (void)a;
  fprintf(stderr, "kiln kernel register: this kiln was built without libkiln (no gRPC core "
                  "found); --server is not available\n");
  return KILN_EXIT_USAGE;
}

#endif

int kiln__cmd_kernel(const kiln__args *a) {
  if (strcmp(a->pos[0], "register") == 0) return kernel_register(a);
  fprintf(stderr, "kiln kernel: unknown subcommand '%s' (register)\n", a->pos[0]);
  return KILN_EXIT_USAGE;
}
