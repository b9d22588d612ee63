# SPDX-License-Identifier: Apache-2.0
# cmake/configdoc.cmake - writes docs/CONFIGURATION.md from its template and the router's settings table.
#   cmake -DROUTER=<xpyd_router> -DIN=<CONFIGURATION.md.in> -DOUT=<file> [-DCHECK=<checked-in file>] -P configdoc.cmake
# With CHECK, OUT is compared with it and the script fails when they differ (the test config_doc_fresh).
execute_process(COMMAND ${ROUTER} --config-reference OUTPUT_VARIABLE table RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${ROUTER} --config-reference failed (${rc})")
endif()
string(STRIP "${table}" table)
file(READ ${IN} text)
string(REPLACE "@SETTINGS@" "${table}" text "${text}")
file(WRITE ${OUT} "${text}")
if(CHECK)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT} ${CHECK} RESULT_VARIABLE diff)
  if(NOT diff EQUAL 0)
    message(FATAL_ERROR "${CHECK} is stale: regenerate it with 'cmake --build build --target config-doc'")
  endif()
endif()
