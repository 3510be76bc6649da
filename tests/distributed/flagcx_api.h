/* The part of FlagCX's C API (flagcx/include/flagcx.h, version 0.13) that sglang-fl binds,
 * restated for the tests: test_flagcx_binding.py checks sglang_fl/distributed/flagcx.py's
 * ctypes prototypes against these declarations (and against the real header when FLAGCX_PATH
 * holds a checkout), and flagcx_double.c is compiled against them with -Werror, so the double
 * cannot drift from the declared signatures. */
#ifndef SGLANG_FL_TEST_FLAGCX_API_H
#define SGLANG_FL_TEST_FLAGCX_API_H

#include <stddef.h>

typedef int flagcxResult_t;   /* enum in FlagCX: flagcxSuccess = 0, ... */
typedef int flagcxDataType_t; /* enum: Int8 0, Uint8 1, Int32 2, Int64 4, Float16 6, Float32 7, ... */
typedef int flagcxRedOp_t;    /* enum: Sum 0, Prod 1, Max 2, Min 3, Avg 4 */

typedef struct { char internal[256]; } flagcxUniqueId;
typedef flagcxUniqueId *flagcxUniqueId_t;
typedef struct flagcxComm *flagcxComm_t;
typedef struct flagcxStream *flagcxStream_t;

/* Leading members of the device handle, in FlagCX's order, up to streamFree. */
struct flagcxDeviceHandle {
  void *deviceSynchronize, *deviceMemcpy, *deviceMemset, *deviceMalloc, *deviceFree;
  void *setDevice, *getDevice, *getDeviceCount, *getVendor, *hostGetDevicePointer;
  void *streamCreate, *streamDestroy;
  flagcxResult_t (*streamCopy)(flagcxStream_t *newStream, void *oldStream);
  flagcxResult_t (*streamFree)(flagcxStream_t stream);
};
typedef struct flagcxDeviceHandle *flagcxDeviceHandle_t;

const char *flagcxGetErrorString(flagcxResult_t result);
flagcxResult_t flagcxGetVersion(int *version);
flagcxResult_t flagcxDeviceHandleInit(flagcxDeviceHandle_t *devHandle);
flagcxResult_t flagcxDeviceHandleFree(flagcxDeviceHandle_t devHandle);
flagcxResult_t flagcxGetUniqueId(flagcxUniqueId_t uniqueId);
flagcxResult_t flagcxCommInitRank(flagcxComm_t *comm, int nranks, flagcxUniqueId_t commId, int rank);
flagcxResult_t flagcxCommDestroy(flagcxComm_t comm);
flagcxResult_t flagcxAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                               flagcxDataType_t datatype, flagcxRedOp_t op, flagcxComm_t comm,
                               flagcxStream_t stream);
flagcxResult_t flagcxReduce(const void *sendbuff, void *recvbuff, size_t count,
                            flagcxDataType_t datatype, flagcxRedOp_t op, int root,
                            flagcxComm_t comm, flagcxStream_t stream);
flagcxResult_t flagcxAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                               flagcxDataType_t datatype, flagcxComm_t comm, flagcxStream_t stream);
flagcxResult_t flagcxReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                   flagcxDataType_t datatype, flagcxRedOp_t op, flagcxComm_t comm,
                                   flagcxStream_t stream);
flagcxResult_t flagcxBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                               flagcxDataType_t datatype, int root, flagcxComm_t comm,
                               flagcxStream_t stream);
flagcxResult_t flagcxSend(const void *sendbuff, size_t count, flagcxDataType_t datatype, int peer,
                          flagcxComm_t comm, flagcxStream_t stream);
flagcxResult_t flagcxRecv(void *recvbuff, size_t count, flagcxDataType_t datatype, int peer,
                          flagcxComm_t comm, flagcxStream_t stream);
flagcxResult_t flagcxGroupStart(flagcxComm_t comm);
flagcxResult_t flagcxGroupEnd(flagcxComm_t comm);

#endif
