/* Golden files: an HLO module followed by the text a test expects from it,
 * in a trailing comment that opens with a line "/" "* EXPECTED" and closes
 * with a line "*" "/". Used by the pass tests under tests/golden/passes/.
 */
#ifndef KILN_TESTS_SUPPORT_GOLDEN_H
#define KILN_TESTS_SUPPORT_GOLDEN_H

#include <stddef.h>

/* The .hlo files of `dir`, sorted by name, as malloc'd paths in a malloc'd
 * array (free with kiln_golden_free_list). Returns the count, or -1 when
 * the directory cannot be read. */
int kiln_golden_list(const char *dir, char ***paths);
void kiln_golden_free_list(char **paths, int n);

/* The whole file, malloc'd and NUL-terminated; NULL when unreadable. */
char *kiln_golden_read(const char *path, size_t *len);

/* The text of the last EXPECTED block (up to and including the newline
 * before its closing line), malloc'd; NULL when there is none or it is not
 * closed. */
char *kiln_golden_expected(const char *text);

/* NULL when want and got are equal, else a malloc'd message naming the
 * first differing line of each. */
char *kiln_golden_diff(const char *want, const char *got);

#endif /* KILN_TESTS_SUPPORT_GOLDEN_H */
