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
# The OpenMPI communicator (savepoint/mpi.h, installed with the other headers) in its own export
# set: savepointConfig.cmake defines savepoint::savepoint_mpi only where MPI is found.
if(TARGET savepoint_mpi)
  install(TARGETS savepoint_mpi EXPORT savepointMpiTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT savepointMpiTargets NAMESPACE savepoint::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
endif()
# The failover controller and agents (savepoint/failover_rpc.h, gRPC) likewise, when built.
if(TARGET savepoint_failover)
  install(TARGETS savepoint_failover EXPORT savepointFailoverTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT savepointFailoverTargets NAMESPACE savepoint::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
endif()
configure_package_config_file(cmake/savepointConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/savepointConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/savepointConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/savepointConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/savepointConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/savepoint)
