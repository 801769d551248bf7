include(CMakePackageConfigHelpers)
install(TARGETS savepoint EXPORT savepointTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/savepoint DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET savepoint_cli)
  install(TARGETS savepoint_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT savepointTargets NAMESPACE savepoint::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
configure_package_config_file(cmake/savepointConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/savepointConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/savepointConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/savepointConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/savepointConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
