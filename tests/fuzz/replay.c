/* Runs a libFuzzer target's inputs without libFuzzer: every file named on
 * the command line, or found in a directory named there (sorted), goes
 * through LLVMFuzzerTestOneInput once. Lets an ordinary build replay a
 * target's seed corpus and regressions as a ctest (fuzz_rpc_replay), so a
 * crash once found stays fixed without a clang fuzz build.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  fclose(f);
  if (buf == NULL) return -1;
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int inputs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) { /* an empty regressions/ folder is not in git */
      fprintf(stderr, "replay: %s: none, skipped\n", argv[i]);
      continue;
    }
    if (!S_ISDIR(sb.st_mode)) {
      if (run_file(argv[i]) == 0) inputs++;
      continue;
    }
    struct dirent **names;
    int n = scandir(argv[i], &names, NULL, by_name);
    for (int k = 0; k < n; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
      if (names[k]->d_name[0] != '.' && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
          run_file(path) == 0)
        inputs++;
      free(names[k]);
    }
    free(names);
  }
  printf("replay: %d inputs, no crash\n", inputs);
  return 0;
}
