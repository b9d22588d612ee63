# SPDX-License-Identifier: Apache-2.0
# cmake/install.cmake - `cmake --install` (GNUInstallDirs layout), man pages generated from each binary's
# --help/--version by help2man (so a flag is documented once, where --help prints it), and the Debian
# package (CPack; scripts/package.sh). Included from the top-level CMakeLists.txt.
include(GNUInstallDirs)

set(XPYD_TOOLS xpyd_router xpyd_sim xpyd_bench xpyd_transfer_bench xpyd_register xpyd_tokenize)
install(TARGETS ${XPYD_TOOLS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS xpyd_transfer xpyd_transfer_shared
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/transfer/xpyd_transfer.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/xpyd)
# relocatable: the prefix is found from where the .pc file is, so a staged or moved install works too
file(RELATIVE_PATH XPYD_PC_TO_PREFIX "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/transfer/xpyd_transfer.pc.in ${CMAKE_BINARY_DIR}/xpyd_transfer.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/xpyd_transfer.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# Python: the binding (Debian's dist-packages layout), finding the library relative to itself (relocatable),
# and the mooncake.engine-compatible package, which users put on PYTHONPATH when they want it.
set(XPYD_PY_DIR lib/python3/dist-packages)
file(WRITE ${CMAKE_BINARY_DIR}/xpyd_transfer_paths.py
     "import os\n# written by cmake --install: where libxpyd_transfer is, relative to this package\n"
     "LIBDIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', '..',\n"
     "                                       '${CMAKE_INSTALL_LIBDIR}'))\n")
install(FILES ${CMAKE_SOURCE_DIR}/python/xpyd_transfer/__init__.py DESTINATION ${XPYD_PY_DIR}/xpyd_transfer)
install(FILES ${CMAKE_BINARY_DIR}/xpyd_transfer_paths.py DESTINATION ${XPYD_PY_DIR}/xpyd_transfer
        RENAME _paths.py)
install(FILES ${CMAKE_SOURCE_DIR}/python/compat/mooncake/__init__.py ${CMAKE_SOURCE_DIR}/python/compat/mooncake/engine.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/xpyd/python-compat/mooncake)
file(GLOB XPYD_CONF_FILES ${CMAKE_SOURCE_DIR}/conf/*.json)
install(FILES ${XPYD_CONF_FILES} DESTINATION ${CMAKE_INSTALL_DATADIR}/xpyd/conf)
install(FILES ${CMAKE_SOURCE_DIR}/conf/grafana/xpyd.json DESTINATION ${CMAKE_INSTALL_DATADIR}/xpyd/grafana)
install(FILES ${CMAKE_SOURCE_DIR}/conf/systemd/xpyd-router.service ${CMAKE_SOURCE_DIR}/conf/systemd/xpyd-sim@.service
        DESTINATION lib/systemd/system)
install(FILES ${CMAKE_SOURCE_DIR}/conf/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${CMAKE_SOURCE_DIR}/conf/systemd/low-port.conf DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
# /etc/xpyd for the package (prefix /usr); <prefix>/etc/xpyd otherwise, so a staged install stays in its prefix
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  install(FILES ${CMAKE_SOURCE_DIR}/conf/debian/router.json DESTINATION /etc/xpyd)
else()
  install(FILES ${CMAKE_SOURCE_DIR}/conf/debian/router.json DESTINATION ${CMAKE_INSTALL_SYSCONFDIR}/xpyd)
endif()

# Man pages: help2man runs each built binary's --help and --version.
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(XPYD_DESC_xpyd_router "OpenAI-compatible router for disaggregated prefill/decode LLM serving")
  set(XPYD_DESC_xpyd_sim "simulated vLLM engine for testing xpyd without GPUs")
  set(XPYD_DESC_xpyd_bench "load generator with the flags and metrics of vLLM's benchmark_serving.py")
  set(XPYD_DESC_xpyd_transfer_bench "throughput benchmark of the xpyd KV transfer engine")
  set(XPYD_DESC_xpyd_register "keeps an engine registered in etcd for xpyd routers while it is healthy")
  set(XPYD_DESC_xpyd_tokenize "token ids of text with a Hugging Face model's tokenizer, as the tokenizers library gives them")
  set(XPYD_MAN_PAGES)
  foreach(tool ${XPYD_TOOLS})
    set(page ${CMAKE_BINARY_DIR}/man/${tool}.1)
    add_custom_command(OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${HELP2MAN} --no-info --no-discard-stderr --section 1 --name "${XPYD_DESC_${tool}}"
              --output ${page} $<TARGET_FILE:${tool}>
      COMMAND gzip -9nf ${page}
      DEPENDS ${tool} VERBATIM)
    set(page ${page}.gz)
    list(APPEND XPYD_MAN_PAGES ${page})
  endforeach()
  add_custom_target(xpyd_man ALL DEPENDS ${XPYD_MAN_PAGES})
  install(FILES ${XPYD_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "help2man not found: no man pages (scripts/deps.sh installs it)")
endif()

# Debian package: build/xpyd_<version>_amd64.deb via scripts/package.sh (prefix /usr, /etc for the config).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME xpyd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "xpyd maintainers <xpyd@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "router for disaggregated (prefill/decode) LLM serving, with simulator and benchmarks")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# python3: the xpyd_transfer binding and the mooncake-compatible package it ships (ctypes, no compiled module)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, python3")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/conf/debian/postinst ${CMAKE_SOURCE_DIR}/conf/debian/prerm
    ${CMAKE_SOURCE_DIR}/conf/debian/postrm ${CMAKE_SOURCE_DIR}/conf/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES TRUE)
include(CPack)
