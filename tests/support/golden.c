/* Reading golden files: listing a directory's .hlo files, reading one,
 * splitting off its EXPECTED block, and describing the first difference
 * between expected and actual text. */
#include "tests/support/golden.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int kiln_golden_list(const char *dir, char ***paths) {
  *paths = NULL;
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  int n = 0, cap = 0;
  char **out = NULL;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    size_t l = strlen(de->d_name);
    if (l <= 4 || strcmp(de->d_name + l - 4, ".hlo") != 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = realloc(out, (size_t)cap * sizeof *out);
      if (grown == NULL) break;
      out = grown;
    }
    size_t need = strlen(dir) + l + 2;
    if ((out[n] = malloc(need)) == NULL) break;
    snprintf(out[n++], need, "%s/%s", dir, de->d_name);
  }
  closedir(d);
  if (n) qsort(out, (size_t)n, sizeof *out, cmp_str);
  *paths = out;
  return n;
}

void kiln_golden_free_list(char **paths, int n) {
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

char *kiln_golden_read(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (buf = malloc((size_t)n + 1)) != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf == NULL) return NULL;
  buf[n] = '\0';
  if (len) *len = (size_t)n;
  return buf;
}

char *kiln_golden_expected(const char *text) {
  const char *tag = "/* EXPECTED\n", *exp = NULL;
  for (const char *p = strstr(text, tag); p; p = strstr(p + 1, tag)) exp = p;
  if (exp == NULL) return NULL;
  const char *body = exp + strlen(tag);
  const char *end = strstr(body - 1, "\n*/");
  if (end == NULL) return NULL;
  size_t n = (size_t)(end + 1 - body);
  if (end + 1 < body) n = 0; /* an empty block */
  char *out = malloc(n + 1);
  if (out == NULL) return NULL;
  memcpy(out, body, n);
  out[n] = '\0';
  return out;
}

char *kiln_golden_diff(const char *want, const char *got) {
  if (strcmp(want, got) == 0) return NULL;
  int line = 1;
  const char *a = want, *b = got, *la = want, *lb = got;
  while (*a && *a == *b) {
    if (*a == '\n') {
      line++;
      la = a + 1;
      lb = b + 1;
    }
    a++;
    b++;
  }
  const char *ea = strchr(la, '\n'), *eb = strchr(lb, '\n');
  int na = ea ? (int)(ea - la) : (int)strlen(la), nb = eb ? (int)(eb - lb) : (int)strlen(lb);
  size_t size = (size_t)na + (size_t)nb + 96;
  char *msg = malloc(size);
  if (msg)
    snprintf(msg, size, "differs at line %d:\n  want: %.*s\n  got:  %.*s", line, na, la, nb, lb);
  return msg;
}
