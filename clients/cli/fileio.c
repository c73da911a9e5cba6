/* Whole-file reads and writes with errors as statuses (see fileio.h).
 *
 * Reads loop until end of file rather than trusting st_size, so pipes and
 * /proc files work and a file that shrinks under us is still read safely. */
#include "clients/cli/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"

int kiln__file_read(const char *path, uint8_t **buf, size_t *len, kiln_status *st) {
  *buf = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kiln_status_set(st, KILN_EIO, path, "cannot open: %s", strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    close(fd);
    return kiln_status_set(st, KILN_EIO, path, "cannot read: is a directory");
  }
  size_t cap = 0, n = 0;
  uint8_t *data = NULL;
  int rc = 0;
  for (;;) {
    if (kiln_grow((void **)&data, &cap, n + 65536 + 1, 1)) {
      rc = kiln_status_set(st, KILN_ENOMEM, path, "out of memory reading the file");
      goto out_free;
    }
    ssize_t got = read(fd, data + n, cap - n - 1);
    if (got < 0) {
      if (errno == EINTR) continue;
      rc = kiln_status_set(st, KILN_EIO, path, "cannot read: %s", strerror(errno));
      goto out_free;
    }
    if (got == 0) break;
    n += (size_t)got;
  }
  close(fd);
  data[n] = '\0';
  *buf = data;
  *len = n;
  return 0;
out_free:
  kiln_free(data);
  close(fd);
  return rc;
}

int kiln__file_write(const char *path, const void *buf, size_t len, kiln_status *st) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return kiln_status_set(st, KILN_EIO, path, "cannot create: %s", strerror(errno));
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t put = write(fd, p, len);
    if (put < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      return kiln_status_set(st, KILN_EIO, path, "cannot write: %s", strerror(e));
    }
    p += put;
    len -= (size_t)put;
  }
  if (close(fd) != 0)
    return kiln_status_set(st, KILN_EIO, path, "cannot write: %s", strerror(errno));
  return 0;
}

int kiln__dir_make(const char *path, kiln_status *st) {
  char *p = kiln_strdup(path);
  if (p == NULL) return kiln_status_set(st, KILN_ENOMEM, path, "out of memory");
  int rc = 0;
  /* Create each prefix in turn; EEXIST on a prefix is fine as long as the
   * final path ends up a directory. */
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char saved = *s;
    *s = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      rc =
          kiln_status_set(st, KILN_EIO, path, "cannot create directory %s: %s", p, strerror(errno));
      goto out;
    }
    *s = saved;
    if (saved == '\0') break;
  }
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
    rc = kiln_status_set(st, KILN_EIO, path, "not a directory");
out:
  kiln_free(p);
  return rc;
}
