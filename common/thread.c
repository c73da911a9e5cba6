/* Threads with a known stack size (thread.h). */
#include "common/thread.h"

int kiln_thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
  pthread_attr_t attr;
  int err = pthread_attr_init(&attr);
  if (err) return err;
  err = pthread_attr_setstacksize(&attr, KILN_THREAD_STACK_BYTES);
  if (err == 0) err = pthread_create(t, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  return err;
}
