/* A test double of libflagcx.so for ONE rank, used where no FlagCX build and no GPU exist.
 *
 * It implements each declared call with the semantics a real single-rank communicator has
 * (every collective copies send to receive; send/recv to self is a FIFO), and it validates what
 * the binding hands it the way FlagCX would reject misuse: unknown data types and reduction ops,
 * a comm or stream it did not issue (or already freed), a unique id it did not generate, a peer
 * or root other than rank 0, unbalanced group calls. `trace` records the last call so tests can
 * see the exact arguments. Nothing here knows about sglang-fl.
 * Build: gcc -shared -fPIC -Wall -Werror -o libflagcx.so flagcx_double.c */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flagcx_api.h"

flagcxResult_t doubleStreamCopy(flagcxStream_t *out, void *raw);
flagcxResult_t doubleStreamFree(flagcxStream_t s);

enum { OK = 0, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };

struct flagcxComm { int live; };
struct flagcxStream { void *base; int live; };

typedef struct {
  char call[32];
  const void *sendbuff;
  void *recvbuff;
  size_t count;
  int datatype, op, root;
  void *comm, *stream, *lastRawStream;
  int streamCopies, streamFrees, groupStarts, groupEnds, opsInGroup, commDestroys, handleFrees;
} Trace;

Trace trace;
int failNext; /* tests set this: the next collective returns it */

static flagcxUniqueId issued;
static int haveIssued, groupDepth;
static struct flagcxComm theComm;
static struct flagcxStream streams[64];
static int nStreams;

typedef struct Msg { struct Msg *next; size_t bytes; int datatype; char data[]; } Msg;
static Msg *queueHead, *queueTail;

static size_t typeSize(int t) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return (t >= 0 && t < 10) ? sizes[t] : 0;
}

const char *flagcxGetErrorString(flagcxResult_t r) {
  switch (r) {
    case OK: return "no error";
    case INVALID_ARGUMENT: return "invalid argument";
    case INVALID_USAGE: return "invalid usage";
    default: return "unhandled error";
  }
}

flagcxResult_t flagcxGetVersion(int *version) { *version = 1300; return OK; }

flagcxResult_t doubleStreamCopy(flagcxStream_t *out, void *raw) {
  if (nStreams == 64) return INVALID_USAGE;
  streams[nStreams].base = raw;
  streams[nStreams].live = 1;
  *out = &streams[nStreams++];
  trace.streamCopies++;
  trace.lastRawStream = raw;
  return OK;
}

flagcxResult_t doubleStreamFree(flagcxStream_t s) {
  if (s < streams || s >= streams + nStreams || !s->live) return INVALID_USAGE;
  s->live = 0;
  trace.streamFrees++;
  return OK;
}

#ifndef OMIT_DEVICE_HANDLE_INIT
flagcxResult_t flagcxDeviceHandleInit(flagcxDeviceHandle_t *h) {
  *h = calloc(1, sizeof(struct flagcxDeviceHandle));
  (*h)->streamCopy = doubleStreamCopy;
  (*h)->streamFree = doubleStreamFree;
  return OK;
}
#endif

flagcxResult_t flagcxDeviceHandleFree(flagcxDeviceHandle_t h) {
  free(h);
  trace.handleFrees++;
  return OK;
}

flagcxResult_t flagcxGetUniqueId(flagcxUniqueId_t id) {
  for (int i = 0; i < 256; i++) id->internal[i] = (char)(i * 7 + 13 + haveIssued);
  issued = *id;
  haveIssued++;
  return OK;
}

flagcxResult_t flagcxCommInitRank(flagcxComm_t *comm, int nranks, flagcxUniqueId_t id, int rank) {
  if (nranks != 1 || rank != 0 || !haveIssued || memcmp(id, &issued, sizeof issued))
    return INVALID_ARGUMENT;
  theComm.live = 1;
  *comm = &theComm;
  return OK;
}

flagcxResult_t flagcxCommDestroy(flagcxComm_t comm) {
  if (comm != &theComm || !comm->live) return INVALID_USAGE;
  comm->live = 0;
  trace.commDestroys++;
  return OK;
}

static flagcxResult_t record(const char *call, const void *s, void *r, size_t n, int t, int op,
                             int root, flagcxComm_t comm, flagcxStream_t stream) {
  strncpy(trace.call, call, sizeof trace.call - 1);
  trace.sendbuff = s; trace.recvbuff = r; trace.count = n;
  trace.datatype = t; trace.op = op; trace.root = root;
  trace.comm = comm; trace.stream = stream;
  if (groupDepth) trace.opsInGroup++;
  if (failNext) { int f = failNext; failNext = 0; return f; }
  if (comm != &theComm || !comm->live) return INVALID_USAGE;
  if (stream < streams || stream >= streams + nStreams || !stream->live) return INVALID_USAGE;
  if (!typeSize(t) || op < 0 || op > 4 || root != 0) return INVALID_ARGUMENT;
  return OK;
}

static void copy(const void *s, void *r, size_t n, int t) {
  if (r && s && r != s && n) memmove(r, s, n * typeSize(t));
}

flagcxResult_t flagcxAllReduce(const void *s, void *r, size_t n, flagcxDataType_t t,
                               flagcxRedOp_t op, flagcxComm_t c, flagcxStream_t st) {
  flagcxResult_t res = record("AllReduce", s, r, n, t, op, 0, c, st);
  if (res == OK) copy(s, r, n, t);
  return res;
}

flagcxResult_t flagcxReduce(const void *s, void *r, size_t n, flagcxDataType_t t,
                            flagcxRedOp_t op, int root, flagcxComm_t c, flagcxStream_t st) {
  flagcxResult_t res = record("Reduce", s, r, n, t, op, root, c, st);
  if (res == OK) copy(s, r, n, t);
  return res;
}

flagcxResult_t flagcxAllGather(const void *s, void *r, size_t n, flagcxDataType_t t,
                               flagcxComm_t c, flagcxStream_t st) {
  flagcxResult_t res = record("AllGather", s, r, n, t, 0, 0, c, st);
  if (res == OK) copy(s, r, n, t);
  return res;
}

flagcxResult_t flagcxReduceScatter(const void *s, void *r, size_t n, flagcxDataType_t t,
                                   flagcxRedOp_t op, flagcxComm_t c, flagcxStream_t st) {
  flagcxResult_t res = record("ReduceScatter", s, r, n, t, op, 0, c, st);
  if (res == OK) copy(s, r, n, t);
  return res;
}

flagcxResult_t flagcxBroadcast(const void *s, void *r, size_t n, flagcxDataType_t t, int root,
                               flagcxComm_t c, flagcxStream_t st) {
  flagcxResult_t res = record("Broadcast", s, r, n, t, 0, root, c, st);
  if (res == OK) copy(s, r, n, t);
  return res;
}

flagcxResult_t flagcxSend(const void *s, size_t n, flagcxDataType_t t, int peer, flagcxComm_t c,
                          flagcxStream_t st) {
  flagcxResult_t res = record("Send", s, NULL, n, t, 0, peer, c, st);
  if (res != OK) return res;
  Msg *m = malloc(sizeof(Msg) + n * typeSize(t));
  m->next = NULL; m->bytes = n * typeSize(t); m->datatype = t;
  if (n) memcpy(m->data, s, m->bytes);
  if (queueTail) queueTail->next = m; else queueHead = m;
  queueTail = m;
  return OK;
}

flagcxResult_t flagcxRecv(void *r, size_t n, flagcxDataType_t t, int peer, flagcxComm_t c,
                          flagcxStream_t st) {
  flagcxResult_t res = record("Recv", NULL, r, n, t, 0, peer, c, st);
  if (res != OK) return res;
  Msg *m = queueHead;
  if (!m || m->bytes != n * typeSize(t) || m->datatype != t) return INVALID_USAGE;
  if (n) memcpy(r, m->data, m->bytes);
  queueHead = m->next;
  if (!queueHead) queueTail = NULL;
  free(m);
  return OK;
}

flagcxResult_t flagcxGroupStart(flagcxComm_t c) {
  if (c != &theComm) return INVALID_USAGE;
  groupDepth++;
  trace.groupStarts++;
  return OK;
}

flagcxResult_t flagcxGroupEnd(flagcxComm_t c) {
  if (c != &theComm || groupDepth == 0) return INVALID_USAGE;
  groupDepth--;
  trace.groupEnds++;
  return OK;
}
