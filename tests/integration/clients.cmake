# Integration tests of the clients against a real kilnd (label
# "integration"): libkiln and the kiln command (test_remote), 16 concurrent
# clients (test_load), hostile requests on the raw gRPC core (test_hostile),
# SIGTERM under load (test_drain), TLS, tokens and the health port
# (test_security), structured logs, compile progress and kiln top with two
# servers sharing a Redis (test_ops), fair scheduling at one device
# (test_scheduler_fair), libkiln's lease renewal (test_lease), and the
# Python grpcio client (test_python_client.py). Each starts its own kilnd on free loopback
# ports; KILND and KILN_CLI tell them where the binaries are, and they exit
# 77 (skipped) without kilnd.
if(NOT TARGET kiln_client)
  return()
endif()
pkg_check_modules(ITEST_GRPC REQUIRED IMPORTED_TARGET grpc gpr)

add_library(kiln_itest STATIC ${CMAKE_CURRENT_LIST_DIR}/itest.c)
target_link_libraries(kiln_itest PUBLIC kiln_test_support)

set(KILN_ITEST_ENV "KILN_CLI=$<TARGET_FILE:kiln>")
if(TARGET kilnd)
  list(APPEND KILN_ITEST_ENV "KILND=$<TARGET_FILE:kilnd>")
endif()

foreach(name test_remote test_load test_hostile test_drain test_cache_server test_cancel test_limits
    test_spmd_server test_upload_wire test_security test_ops test_scheduler_fair test_cuda_service
    test_lease test_cuda_stats)
  if(NOT EXISTS ${CMAKE_CURRENT_LIST_DIR}/${name}.c)
    continue()
  endif()
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.c)
  target_link_libraries(${name} PRIVATE kiln_itest kiln_client PkgConfig::ITEST_GRPC)
  if(TARGET kilnd)
    add_dependencies(${name} kilnd kiln)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS integration TIMEOUT 900 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${KILN_ITEST_ENV}")
endforeach()
# kilnd with the fake driver's GPUs (tests/fake_cuda/), for Stats and /metrics.
if(TARGET test_cuda_stats AND TARGET kiln_fake_cuda)
  target_compile_definitions(test_cuda_stats PRIVATE
                             KILN_FAKE_CUDA="$<TARGET_FILE:kiln_fake_cuda>")
  add_dependencies(test_cuda_stats kiln_fake_cuda)
endif()

if(DEFINED KILN_DEFAULT_PYTHON)
  set(KILN_ITEST_PYTHON ${KILN_DEFAULT_PYTHON})
elseif(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  set(KILN_ITEST_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
else()
  set(KILN_ITEST_PYTHON python3)
endif()
add_test(NAME test_python_client
  COMMAND sh -c "exec \"\${KILN_PYTHON:-${KILN_ITEST_PYTHON}}\" \"$@\"" test_python_client
          ${CMAKE_CURRENT_LIST_DIR}/test_python_client.py
          --proto-dir ${CMAKE_SOURCE_DIR}/proto --source-dir ${CMAKE_SOURCE_DIR})
set_tests_properties(test_python_client PROPERTIES LABELS integration TIMEOUT 600
                     SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_ITEST_ENV}")

# Installed libkiln: the header, the library and kiln.pc, used from outside.
add_test(NAME test_libkiln_install
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_libkiln_install.sh ${CMAKE_BINARY_DIR})
set_tests_properties(test_libkiln_install PROPERTIES LABELS integration TIMEOUT 300)

# The differential test of the one contract: every program of the test set
# (JAX peer programs, examples, a sample of the corpus, bad inputs) through
# `kiln` in process and through a real kilnd, outputs, diagnostics and exit
# codes compared (test_remote_diff.py says what is compared and sampled).
if(TARGET kilnd)
  if(DEFINED ENV{KILN_CORPUS_DIR})
    set(_kiln_diff_corpus "$ENV{KILN_CORPUS_DIR}")
  elseif(DEFINED KILN_CORPUS_DIR)
    set(_kiln_diff_corpus "${KILN_CORPUS_DIR}")
  else()
    set(_kiln_diff_corpus "${CMAKE_SOURCE_DIR}/../shared/corpus/xla-hlo")
  endif()
  add_test(NAME test_remote_diff
    COMMAND sh -c "exec \"\${KILN_PYTHON:-${KILN_ITEST_PYTHON}}\" \"$@\"" test_remote_diff
            ${CMAKE_CURRENT_LIST_DIR}/test_remote_diff.py --source-dir ${CMAKE_SOURCE_DIR}
            --corpus-default ${_kiln_diff_corpus})
  set_tests_properties(test_remote_diff PROPERTIES LABELS "integration;peer" TIMEOUT 900
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_ITEST_ENV};JAX_PLATFORMS=cpu")
endif()

# kiln.debug_print (and the other issue-17 tools) through kilnd next to the
# local runs: test_toolbox.py.
if(TARGET kilnd)
  add_test(NAME test_toolbox
    COMMAND sh -c "exec \"\${KILN_PYTHON:-${KILN_ITEST_PYTHON}}\" \"$@\"" test_toolbox
            ${CMAKE_CURRENT_LIST_DIR}/test_toolbox.py)
  set_tests_properties(test_toolbox PROPERTIES LABELS integration TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_ITEST_ENV}")
  # Bounded dynamic shapes through kilnd: one executable serves every size.
  add_test(NAME test_dynamic_server
    COMMAND sh -c "exec \"\${KILN_PYTHON:-${KILN_ITEST_PYTHON}}\" \"$@\"" test_dynamic_server
            ${CMAKE_CURRENT_LIST_DIR}/test_dynamic_server.py --proto-dir ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(test_dynamic_server PROPERTIES LABELS integration TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_ITEST_ENV}")
  # CompileOptions.memory_budget_bytes (rematerialization) through kilnd.
  add_test(NAME test_remat_server
    COMMAND sh -c "exec \"\${KILN_PYTHON:-${KILN_ITEST_PYTHON}}\" \"$@\"" test_remat_server
            ${CMAKE_CURRENT_LIST_DIR}/test_remat_server.py)
  set_tests_properties(test_remat_server PROPERTIES LABELS integration TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_ITEST_ENV}")
  # User kernels: RegisterKernel and programs calling them through kilnd.
  add_test(NAME test_user_kernels_server
    COMMAND sh -c "exec \"\${KILN_PYTHON:-${KILN_ITEST_PYTHON}}\" \"$@\"" test_user_kernels_server
            ${CMAKE_CURRENT_LIST_DIR}/test_user_kernels_server.py)
  set_tests_properties(test_user_kernels_server PROPERTIES LABELS integration TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_ITEST_ENV}")
endif()
