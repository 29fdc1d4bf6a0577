# The environment of a seed_api test run: the recording HIP double and a fresh log for it (the
# test compares the launches it records), and the image directory when one is given.
function(seed_test_environment test double image_dir log_dir)
  set(_env)
  if(double)
    set(_log ${log_dir}/hip-double-${test}.jsonl)
    # A fresh log per run: the test reads the records its own calls appended.
    file(REMOVE ${_log})
    list(APPEND _env AOTRITON_HIP_LIBRARY=${double} AOTRITON_HIP_DOUBLE_LOG=${_log})
  endif()
  if(image_dir)
    list(APPEND _env AOTRITON_IMAGE_DIR=${image_dir})
  endif()
  if(_env)
    set_tests_properties(${test} PROPERTIES ENVIRONMENT "${_env}")
  endif()
  set_tests_properties(${test} PROPERTIES FAIL_REGULAR_EXPRESSION "^FAIL |\nFAIL ")
endfunction()
