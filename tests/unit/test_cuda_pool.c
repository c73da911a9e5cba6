/* The CUDA device pool's driver loading (executor/cuda/cuda_driver.c):
 * on a machine without an NVIDIA driver (CI's) there are zero CUDA
 * devices and the reason names the driver; with a driver present the
 * count agrees with the devices' descriptions. Each case runs in its own
 * process (Check's fork mode), so KILN_CUDA_DRIVER set by one case is seen
 * by the driver's first load there. Without the toolkit's headers the pool
 * is not built and this suite only says so.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_HAVE_CUDA
#include "executor/cuda/cuda.h"

START_TEST(no_driver_is_zero_devices_with_a_reason) {
  setenv("KILN_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_uint_eq(kiln_cuda_device_count(&st), 0);
  ck_assert_int_eq(st.code, KILN_EUNAVAIL);
  ck_assert_msg(strstr(st.msg, "no NVIDIA driver") != NULL, "%s", st.msg);
  kiln_cuda_device_info info;
  ck_assert_int_eq(kiln_cuda_device_info_get(0, &info, &st), KILN_ERANGE);
  ck_assert_uint_eq(kiln_cuda_device_count(NULL), 0); /* kept, and st may be NULL */
}
END_TEST

START_TEST(this_machine_devices_agree) {
  kiln_status st;
  kiln_status_clear(&st);
  uint32_t n = kiln_cuda_device_count(&st);
  if (n == 0) {
    fprintf(stderr, "skipped: no GPU here (%s)\n", st.msg);
    ck_assert_int_eq(st.code, KILN_EUNAVAIL);
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    kiln_cuda_device_info info;
    ck_assert_int_eq(kiln_cuda_device_info_get(i, &info, &st), 0);
    ck_assert_uint_gt(info.total_memory, 0);
    ck_assert_int_ge(info.cc_major, 7);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_pool");
  TCase *c = tcase_create("driver");
  tcase_add_test(c, no_driver_is_zero_devices_with_a_reason);
  tcase_add_test(c, this_machine_devices_agree);
  suite_add_tcase(s, c);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
#else
int main(void) {
  printf("cuda_pool: built without the CUDA device pool (no cuda.h): nothing to test\n");
  return 0;
}
#endif
