#!/bin/sh
# libkiln as a user gets it: `cmake --install` into a temporary prefix, then
# a C program built only with `pkg-config --cflags --libs kiln` (no access to
# the source tree) builds a module with the builder API, verifies it, and
# sees UNAVAILABLE from a port nobody listens on.
#   test_libkiln_install.sh BUILD_DIR
set -eu
build=$1
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
cat >"$prefix/user.c" <<'PROG'
#include <kiln.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  kiln_builder *b = kiln_builder_create("user");
  int64_t dims[1] = {3};
  kiln_id x = kiln_builder_parameter(b, KILN_F32, dims, 1, "x");
  kiln_id y = kiln_builder_binary(b, KILN_OP_MULTIPLY, x, x);
  kiln_module *m;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_builder_finish(b, y, &m, &st)) {
    printf("finish: %s\n", st.msg);
    return 1;
  }
  kiln_builder_destroy(b);
  char *text = kiln_module_print(m, NULL);
  int ok = text && strstr(text, "multiply(") != NULL;
  kiln_free(text);
  kiln_module_destroy(m);
  kiln_client *c;
  kiln_client_options o = {.connect_timeout_ms = 2000};
  int rc = kiln_client_connect("127.0.0.1:1", &o, &c, &st);
  printf("%s %d %s\n", ok ? "module-ok" : "module-bad", rc,
         kiln_rpc_code_name(kiln_rpc_status_code(&st)));
  return 0;
}
PROG
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib/$(gcc -print-multiarch 2>/dev/null)/pkgconfig"
cc -std=c11 -Wall -Wextra -Werror -o "$prefix/user" "$prefix/user.c" $(pkg-config --cflags --libs kiln)
libdir=$(pkg-config --variable=libdir kiln)
out=$(LD_LIBRARY_PATH="$libdir" "$prefix/user")
echo "$out"
[ "$out" = "module-ok -13 UNAVAILABLE" ]
