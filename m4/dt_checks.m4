# dt_checks.m4: configure checks for dtrain's optional and required dependencies.

# DT_CHECK_OPENBLAS: OpenBLAS is required; the error names the Debian package.
AC_DEFUN([DT_CHECK_OPENBLAS], [
  PKG_CHECK_MODULES([OPENBLAS], [openblas], [dt_have_openblas=yes], [dt_have_openblas=no])
  AS_IF([test "x$dt_have_openblas" = "xno"], [
    AC_CHECK_LIB([openblas], [cblas_sgemm], [OPENBLAS_LIBS=-lopenblas; OPENBLAS_CFLAGS=],
      [AC_MSG_ERROR([OpenBLAS not found: install the Debian package libopenblas-dev (or set PKG_CONFIG_PATH)])])
  ])
  dt_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS $OPENBLAS_CFLAGS"
  AC_CHECK_HEADER([cblas.h], [],
    [AC_MSG_ERROR([cblas.h not found: install the Debian package libopenblas-dev])])
  CFLAGS=$dt_save_CFLAGS
  AC_SUBST([OPENBLAS_CFLAGS])
  AC_SUBST([OPENBLAS_LIBS])
])

# DT_CHECK_SODIUM: libsodium (required) for the job secret's HMAC-SHA256 (src/comm/auth.c).
AC_DEFUN([DT_CHECK_SODIUM], [
  PKG_CHECK_MODULES([SODIUM], [libsodium], [dt_have_sodium=yes], [dt_have_sodium=no])
  AS_IF([test "x$dt_have_sodium" = "xno"], [
    AC_CHECK_LIB([sodium], [crypto_auth_hmacsha256_init], [SODIUM_LIBS=-lsodium; SODIUM_CFLAGS=],
      [AC_MSG_ERROR([libsodium not found: install the Debian package libsodium-dev])])
  ])
  dt_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS $SODIUM_CFLAGS"
  AC_CHECK_HEADER([sodium.h], [], [AC_MSG_ERROR([sodium.h not found: install the Debian package libsodium-dev])])
  CFLAGS=$dt_save_CFLAGS
  AC_SUBST([SODIUM_CFLAGS])
  AC_SUBST([SODIUM_LIBS])
])

# DT_CHECK_VISIBILITY: DT_VISIBILITY_CFLAGS=-fvisibility=hidden when the compiler takes it
# and honours visibility("default") (GCC, clang), so libdtrain.so exports only the functions
# src/dt_api.h's DT_API marks; empty otherwise (everything is exported, as before).
AC_DEFUN([DT_CHECK_VISIBILITY], [
  AC_MSG_CHECKING([whether $CC supports -fvisibility=hidden])
  dt_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS -fvisibility=hidden -Werror"
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[__attribute__((visibility("default"))) int dt_conftest_api(void);
int dt_conftest_api(void) { return 0; }]], [[return dt_conftest_api();]])],
    [dt_visibility=yes], [dt_visibility=no])
  CFLAGS=$dt_save_CFLAGS
  AC_MSG_RESULT([$dt_visibility])
  AS_IF([test "x$dt_visibility" = "xyes"],
    [DT_VISIBILITY_CFLAGS=-fvisibility=hidden; dt_visibility_summary="the DT_API functions (-fvisibility=hidden)"],
    [DT_VISIBILITY_CFLAGS=; dt_visibility_summary="every symbol (no -fvisibility=hidden)"])
  AC_SUBST([DT_VISIBILITY_CFLAGS])
])

# DT_CHECK_VECT_CFLAGS: DT_VECT_CFLAGS = the loop-vectorisation flags of the CPU kernels
# that this compiler accepts (GCC: -ftree-vectorize -fvect-cost-model=dynamic; clang
# vectorises at -O2 and has no cost-model flag), so both compilers build dtrain.
AC_DEFUN([DT_CHECK_VECT_CFLAGS], [
  DT_VECT_CFLAGS=
  for dt_flag in -ftree-vectorize -fvect-cost-model=dynamic; do
    AC_MSG_CHECKING([whether $CC accepts $dt_flag])
    dt_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS $dt_flag -Werror"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[]], [[return 0;]])], [dt_ok=yes], [dt_ok=no])
    CFLAGS=$dt_save_CFLAGS
    AC_MSG_RESULT([$dt_ok])
    AS_IF([test "x$dt_ok" = "xyes"], [DT_VECT_CFLAGS="$DT_VECT_CFLAGS $dt_flag"])
  done
  AC_SUBST([DT_VECT_CFLAGS])
])

# DT_CHECK_MPI: --with-mpi[=DIR]. Default: use Open MPI's mpicc if found, and say so.
# We keep CC as it is and take MPI's flags from the wrapper, so only src/comm/mpi.c needs them.
AC_DEFUN([DT_CHECK_MPI], [
  AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=DIR@:>@], [build the MPI backend (default: if mpicc is found)])],
    [], [with_mpi=check])
  dt_mpi_summary=no
  MPI_CFLAGS=; MPI_LIBS=; MPIRUN=
  AS_IF([test "x$with_mpi" != "xno"], [
    dt_mpicc=
    AS_CASE([$with_mpi],
      [yes|check], [AC_PATH_PROG([dt_mpicc], [mpicc])],
      [AS_IF([test -x "$with_mpi/bin/mpicc"], [dt_mpicc="$with_mpi/bin/mpicc"])])
    AS_IF([test -n "$dt_mpicc"], [
      MPI_CFLAGS=`$dt_mpicc --showme:compile 2>/dev/null || $dt_mpicc -compile_info 2>/dev/null | cut -d' ' -f2-`
      MPI_LIBS=`$dt_mpicc --showme:link 2>/dev/null || $dt_mpicc -link_info 2>/dev/null | cut -d' ' -f2-`
      dt_save_CFLAGS=$CFLAGS; dt_save_LIBS=$LIBS
      CFLAGS="$CFLAGS $MPI_CFLAGS"; LIBS="$LIBS $MPI_LIBS"
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]], [[MPI_Init(0, 0); MPI_Finalize();]])],
        [dt_mpi_ok=yes], [dt_mpi_ok=no])
      CFLAGS=$dt_save_CFLAGS; LIBS=$dt_save_LIBS
      dt_mpirun_dir=`AS_DIRNAME(["$dt_mpicc"])`
      MPIRUN="$dt_mpirun_dir/mpirun"
    ], [dt_mpi_ok=no])
    AS_IF([test "x$dt_mpi_ok" = "xyes"], [
      dt_mpi_summary="yes (via $dt_mpicc)"
      AC_MSG_NOTICE([MPI backend: using $dt_mpicc])
    ], [
      AS_IF([test "x$with_mpi" != "xcheck"],
        [AC_MSG_ERROR([--with-mpi was given but no working mpicc/mpi.h was found: install the Debian packages libopenmpi-dev openmpi-bin])])
      MPI_CFLAGS=; MPI_LIBS=; MPIRUN=
      AC_MSG_NOTICE([MPI backend: off (no mpicc found; install libopenmpi-dev openmpi-bin to enable)])
    ])
  ])
  AS_IF([test "x$dt_mpi_ok" = "xyes"], [AC_DEFINE([DT_HAVE_MPI], [1], [Define if the MPI backend is built])])
  AM_CONDITIONAL([HAVE_MPI], [test "x$dt_mpi_ok" = "xyes"])
  AC_SUBST([MPI_CFLAGS])
  AC_SUBST([MPI_LIBS])
  AC_SUBST([MPIRUN])
])

# DT_CHECK_CUDA: --with-cuda[=DIR] (off by default; an error when asked for and missing),
# --with-cuda-arch=LIST (default: sm_80 and sm_90 with PTX).
AC_DEFUN([DT_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA compute backend (default: no; DIR defaults to /usr/local/cuda)])],
    [], [with_cuda=no])
  AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST], [comma-separated SM versions to build for (default: 80,90)])],
    [], [with_cuda_arch="80,90"])
  dt_cuda_summary=no
  CUDA_CFLAGS=; CUDA_LIBS=; NVCC=; NVCC_ARCH_FLAGS=
  AS_IF([test "x$with_cuda" != "xno"], [
    AS_IF([test "x$with_cuda" = "xyes"], [dt_cuda_dir=/usr/local/cuda], [dt_cuda_dir=$with_cuda])
    AS_IF([test -x "$dt_cuda_dir/bin/nvcc"], [NVCC="$dt_cuda_dir/bin/nvcc"],
      [AC_MSG_ERROR([--with-cuda: nvcc not found in $dt_cuda_dir/bin (give --with-cuda=DIR of the CUDA toolkit)])])
    CUDA_CFLAGS="-I$dt_cuda_dir/include"
    dt_cuda_libdir="$dt_cuda_dir/lib64"
    AS_IF([test -d "$dt_cuda_libdir"], [], [dt_cuda_libdir="$dt_cuda_dir/lib"])
    dt_save_CFLAGS=$CFLAGS; dt_save_LIBS=$LIBS
    CFLAGS="$CFLAGS $CUDA_CFLAGS"; LIBS="-L$dt_cuda_libdir -lcublas -lcudart $LIBS"
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>
#include <cublas_v2.h>]], [[int n; cudaGetDeviceCount(&n); cublasHandle_t h; cublasCreate(&h);]])],
      [], [AC_MSG_ERROR([--with-cuda: cannot link against cudart and cublas in $dt_cuda_libdir])])
    CFLAGS=$dt_save_CFLAGS; LIBS=$dt_save_LIBS
    CUDA_LIBS="-L$dt_cuda_libdir -Wl,-rpath,$dt_cuda_libdir -lcublas -lcudart"
    for a in `echo $with_cuda_arch | tr ',' ' '`; do
      NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$a,code=sm_$a"
      dt_last_arch=$a
    done
    NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$dt_last_arch,code=compute_$dt_last_arch"
    dt_cuda_summary="yes ($NVCC; sm $with_cuda_arch + PTX)"
    AC_DEFINE([DT_HAVE_CUDA], [1], [Define if the CUDA backend is built])
  ])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$with_cuda" != "xno"])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC])
  AC_SUBST([NVCC_ARCH_FLAGS])
])

# DT_CHECK_NCCL: --with-nccl[=DIR] (off by default unless --with-cuda finds it; an error when asked for and missing).
AC_DEFUN([DT_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@], [build the NCCL communication backend (default: no)])],
    [], [with_nccl=no])
  dt_nccl_summary=no
  NCCL_CFLAGS=; NCCL_LIBS=
  AS_IF([test "x$with_nccl" != "xno"], [
    AS_IF([test "x$with_cuda" = "xno"], [AC_MSG_ERROR([--with-nccl needs --with-cuda])])
    AS_IF([test "x$with_nccl" = "xyes"], [dt_nccl_dir=$dt_cuda_dir], [dt_nccl_dir=$with_nccl])
    dt_nccl_libdir="$dt_nccl_dir/lib64"
    AS_IF([test -d "$dt_nccl_libdir"], [], [dt_nccl_libdir="$dt_nccl_dir/lib"])
    dt_save_CFLAGS=$CFLAGS; dt_save_LIBS=$LIBS
    CFLAGS="$CFLAGS $CUDA_CFLAGS -I$dt_nccl_dir/include"; LIBS="-L$dt_nccl_libdir -lnccl $CUDA_LIBS $LIBS"
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[ncclUniqueId id; ncclGetUniqueId(&id);]])],
      [], [AC_MSG_ERROR([--with-nccl: nccl.h or libnccl not found under $dt_nccl_dir])])
    CFLAGS=$dt_save_CFLAGS; LIBS=$dt_save_LIBS
    NCCL_CFLAGS="-I$dt_nccl_dir/include"
    NCCL_LIBS="-L$dt_nccl_libdir -Wl,-rpath,$dt_nccl_libdir -lnccl"
    dt_nccl_summary="yes ($dt_nccl_dir)"
    AC_DEFINE([DT_HAVE_NCCL], [1], [Define if the NCCL backend is built])
  ])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$with_nccl" != "xno"])
  AC_SUBST([NCCL_CFLAGS])
  AC_SUBST([NCCL_LIBS])
])
