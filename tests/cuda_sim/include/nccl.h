/* The CUDA simulation's NCCL (tests/cuda_sim/nccl.cc): the subset cuda/ uses,
 * between the devices of one process. */
#ifndef DP_SIM_NCCL_H
#define DP_SIM_NCCL_H

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 0

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclFloat32 = 7
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;
typedef struct dp_sim_comm *ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct {
  size_t size;
  unsigned int magic, version;
  int blocking;
  int cgaClusterSize, minCTAs, maxCTAs;
  const char *netName;
  int splitShare;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER                                                            \
  { sizeof(ncclConfig_t), 0xcafebeef, 22700, 1, 0, 0, 0, NULL, 0 }

extern "C" {
const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devs);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(ncclComm_t comm, int *n);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
}

#endif
