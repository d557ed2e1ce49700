# install.cmake - `cmake --install BUILD --prefix P` and the embedding example.
#
#   P/bin/gradc                          the command line
#   P/include/gradc.h                    the public C API
#   P/lib/libgradc.a                     gradc_core, the whole compiler and runtime
#   P/lib/libgradc.so*                   the same as a shared library (the public API only)
#   P/lib/cmake/gradc/gradcConfig.cmake  find_package(gradc): gradc::gradc (shared),
#                                        gradc::shared, gradc::static
#   P/lib/cmake/gradc/gradcConfigVersion.cmake
#   P/lib/pkgconfig/gradc.pc             pkg-config --libs gradc (the shared library)
#   P/lib/pkgconfig/gradc-static.pc      pkg-config --static --libs gradc-static (libgradc.a)
#
# libgradc.a is static, so the package files carry its link dependencies:
# the CMake package finds them (find_dependency, pkg-config) and the .pc
# lists them in Requires.private / Libs.private.  They must match
# gradc_core's link line in CMakeLists.txt; tests/install/run.sh (ctest
# install_embed) links a program against the installed package both ways
# and would fail on a missing one.  Both files are relocatable.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# gradc_core's dependencies.
set(GRADC_PC_REQUIRES libcjson)
set(GRADC_LINK_DIRS "")
set(GRADC_LINK_LIBS "")
set(GRADC_PC_LIBS_PRIVATE "")
if(GRADC_BLAS)
  list(APPEND GRADC_PC_REQUIRES openblas)
endif()
if(GRADC_ONEDNN)
  list(APPEND GRADC_LINK_LIBS ${DNNL_LIB} ${OpenMP_C_LIBRARIES})
  string(APPEND GRADC_PC_LIBS_PRIVATE "${DNNL_LIB} ")
  foreach(lib ${OpenMP_C_LIBRARIES})
    string(APPEND GRADC_PC_LIBS_PRIVATE "${lib} ")
  endforeach()
endif()
if(GRADC_BLIS)
  list(APPEND GRADC_LINK_LIBS ${BLIS_LIB})
  string(APPEND GRADC_PC_LIBS_PRIVATE "${BLIS_LIB} ")
endif()
if(GRADC_LLVM)
  list(APPEND GRADC_LINK_DIRS ${LLVM_LIBDIR})
  list(APPEND GRADC_LINK_LIBS ${LLVM_LIBS_LIST})
  string(APPEND GRADC_PC_LIBS_PRIVATE "-L${LLVM_LIBDIR} ${LLVM_LIBS} ")
endif()
list(APPEND GRADC_LINK_LIBS m ${CMAKE_DL_LIBS})
set(GRADC_LINK_OPTIONS "")
set(GRADC_PC_SHARED_LIBS "")
if(GRADC_SANITIZE) # an instrumented libgradc.a or .so needs the sanitizer runtimes
  set(GRADC_LINK_OPTIONS -fsanitize=address,undefined)
  set(GRADC_PC_SHARED_LIBS " -fsanitize=address,undefined")
  string(APPEND GRADC_PC_LIBS_PRIVATE "-fsanitize=address,undefined ")
endif()
string(APPEND GRADC_PC_LIBS_PRIVATE "-pthread -lm")
foreach(lib ${CMAKE_DL_LIBS})
  string(APPEND GRADC_PC_LIBS_PRIVATE " -l${lib}")
endforeach()
string(REPLACE ";" " " GRADC_PC_REQUIRES_STR "${GRADC_PC_REQUIRES}")
file(RELATIVE_PATH GRADC_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" GRADC_PC_TO_PREFIX "${GRADC_PC_TO_PREFIX}")

install(TARGETS gradc RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/gradc.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES $<TARGET_FILE:gradc_core> DESTINATION ${CMAKE_INSTALL_LIBDIR} RENAME libgradc.a)
install(TARGETS gradc_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
set(GRADC_SHARED_FILE libgradc.so.${PROJECT_VERSION})
set(GRADC_SHARED_SONAME libgradc.so.${GRADC_SOVERSION})

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/gradcConfig.cmake.in ${CMAKE_BINARY_DIR}/gradcConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradc
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/gradcConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/gradcConfig.cmake ${CMAKE_BINARY_DIR}/gradcConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradc)
configure_file(${CMAKE_SOURCE_DIR}/gradc.pc.in ${CMAKE_BINARY_DIR}/gradc.pc @ONLY)
configure_file(${CMAKE_SOURCE_DIR}/gradc-static.pc.in ${CMAKE_BINARY_DIR}/gradc-static.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/gradc.pc ${CMAKE_BINARY_DIR}/gradc-static.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# examples/embed.c built in the tree (through gradc.h only), and the same
# program built against an installed package.
add_executable(gradc_embed examples/embed.c)
target_link_libraries(gradc_embed PRIVATE gradc_core)
if(GRADC_TESTS)
  add_test(NAME embed COMMAND gradc_embed)
  add_test(NAME install_embed
    COMMAND sh ${CMAKE_SOURCE_DIR}/tests/install/run.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
            ${CMAKE_COMMAND} ${CMAKE_C_COMPILER} ${PKG_CONFIG_EXECUTABLE})
  set_tests_properties(embed install_embed PROPERTIES ENVIRONMENT "GRADC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
  set_tests_properties(install_embed PROPERTIES TIMEOUT 600)
endif()
