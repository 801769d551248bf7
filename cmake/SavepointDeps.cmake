# Every dependency comes from a Debian package (see scripts/deps and README "Dependencies").
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)   # manifest JSON (public: savepoint/value.h exposes Json)
find_package(fmt REQUIRED)                  # message formatting inside the library
find_package(spdlog REQUIRED)               # library logging
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)   # CRC32C (crc32_iscsi), SIMD-accelerated
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)  # per-chunk compression (zstd)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)     # per-chunk compression (lz4)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing) # io_uring submission of direct I/O
find_package(OpenSSL REQUIRED)              # encryption (EVP: AES-GCM/CBC, SM4-CBC), HMAC, HKDF; base64
find_package(Protobuf REQUIRED)             # MindSpore .ckpt messages (protobuf wire format)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)      # crc32_combine for .ckpt CRC trailers
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)   # S3: HTTP(S), SigV4 signing, connection reuse
pkg_check_modules(PUGIXML REQUIRED IMPORTED_TARGET pugixml)  # S3: XML response bodies
if(SAVEPOINT_BUILD_TOOLS)
  find_package(CLI11 REQUIRED)
endif()
if(SAVEPOINT_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
# OpenMPI (Debian libopenmpi-dev) for the savepoint_mpi communicator; optional: without it the
# library builds and the MPI target and tests are skipped.
find_package(MPI COMPONENTS CXX QUIET)
# gRPC (Debian libgrpc++-dev, protobuf-compiler-grpc) for the failover controller and agents
# (savepoint_failover, `savepoint controller`, docs/FAILOVER.md); optional like MPI: without it
# that library, the subcommand, the example and their tests are skipped.
option(SAVEPOINT_BUILD_FAILOVER "Build the gRPC failover controller and agents when gRPC is found"
       ON)
if(SAVEPOINT_BUILD_FAILOVER)
  pkg_check_modules(GRPCPP QUIET IMPORTED_TARGET grpc++)
  find_program(SAVEPOINT_GRPC_CPP_PLUGIN grpc_cpp_plugin)
endif()
# pip builds (pyproject.toml) require it: a wheel without the failover agent is not the product.
option(SAVEPOINT_REQUIRE_FAILOVER "Fail the configure step when the failover build is impossible"
       OFF)
if(SAVEPOINT_BUILD_FAILOVER AND GRPCPP_FOUND AND SAVEPOINT_GRPC_CPP_PLUGIN)
  set(SAVEPOINT_HAVE_GRPC ON)
elseif(SAVEPOINT_REQUIRE_FAILOVER)
  message(FATAL_ERROR "the failover agent needs gRPC: install Debian's libgrpc++-dev and "
                      "protobuf-compiler-grpc (scripts/deps), or build without "
                      "SAVEPOINT_REQUIRE_FAILOVER")
else()
  set(SAVEPOINT_HAVE_GRPC OFF)
  message(STATUS "gRPC not found (or SAVEPOINT_BUILD_FAILOVER=OFF): savepoint_failover and `savepoint controller` are not built")
endif()
