/*
 * gpu_emu/nccl.h: a stand-in for NCCL (see cuda_runtime.h here), so src/comm/nccl.c runs
 * unchanged between real processes without a GPU (tests/gpu_emu.sh).
 *
 * A communicator is a dtrain "tcp" communicator of its own: ncclGetUniqueId makes a
 * private directory and the id names a file:// rendezvous in it (rank 0 removes it when
 * its communicator goes). Each operation checks its buffers, then is queued on its
 * stream (gpu_emu's lazy streams) and runs as the matching dt_* collective on the
 * device memory, which is host memory here, when the stream is waited for:
 *
 *   - a buffer that is not device or pinned memory of the current device (a host pointer,
 *     a range past its allocation's end) is ncclInvalidArgument, with the call, the
 *     argument and the address in ncclGetLastError and on stderr;
 *   - as NCCL does, two ranks of a communicator on one GPU (the same host and PCI bus id)
 *     are refused at init with ncclInvalidUsage ("Duplicate GPU detected");
 *   - a collective that fails (a peer died, a timeout of the inner communicator:
 *     DT_TIMEOUT) leaves its stream stalled, as a hung NCCL kernel would, and reports
 *     ncclRemoteError through ncclCommGetAsyncError until ncclCommAbort;
 *   - ncclSend/ncclRecv between ncclGroupStart/End are run at ncclGroupEnd as pairs with
 *     one peer each (the lower rank sends first), enough for pairwise exchanges.
 *
 * Non-blocking communicators (config.blocking = 0) finish every call before returning
 * (ncclSuccess), which NCCL allows, but a split: it reports ncclInProgress, and the parent
 * answers ncclInProgress to ncclCommGetAsyncError at least once more (1 + K times with
 * DT_GPU_EMU_NOTREADY=K); any other call on the parent before then is refused
 * (ncclInvalidUsage), as a caller that did not wait for the split's end would misuse NCCL.
 */
#ifndef DT_GPU_EMU_NCCL_H
#define DT_GPU_EMU_NCCL_H

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 22700
#define NCCL_SPLIT_NOCOLOR -1

typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
} ncclResult_t;
typedef enum {
    ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4,
    ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8,
    ncclDouble = 8, ncclBfloat16 = 9,
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct emu_nccl *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER { sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION_CODE, 1, 0, 0, 0, NULL, 0 }

#ifdef __cplusplus
extern "C" {
#endif
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char  *ncclGetErrorString(ncclResult_t result);
const char  *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
#ifdef __cplusplus
}
#endif

#endif
