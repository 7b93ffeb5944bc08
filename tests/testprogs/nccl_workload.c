// SPDX-License-Identifier: Apache-2.0
// Probe target: calls the NCCL API in a pattern given on the command line and
// prints exactly what it called, so tests can compare a trace with the truth.
//
// Runs against the in-tree stub (RUNPATH) or, with
// LD_LIBRARY_PATH=/usr/local/cuda/lib64, against real NCCL, where with no GPU
// ncclCommInitRank fails, the comm stays NULL and every collective returns
// ncclInvalidArgument at once. Entry probes fire all the same.
//
// Call order in a thread: one round walks the kinds round-robin in the order
// given to --calls, skipping kinds whose share is used up. With --dtype all,
// call j of a thread (counted over its whole life) uses datatype j % 12, i.e.
// the ncclDataType_t value; the names below are listed in that order.
// Stream is NULL, op ncclSum, root 0 (--root), peer (rank+1) % nranks.
// Buffers are small static arrays: the stub never touches them and real NCCL
// rejects the comm before it looks at them.
//
// Build with -DNCCL_WORKLOAD_DLOPEN_ONLY for a binary that references no NCCL
// symbol (with --as-needed, no libnccl in DT_NEEDED); it requires --dlopen.
#define _GNU_SOURCE
#include "nccl_stub.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum kind { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BCAST, REDUCE,
            SEND, RECV, ALL_TO_ALL, GATHER, SCATTER, NKINDS };
static const char *const kind_names[NKINDS] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "bcast", "reduce",
    "send", "recv", "all_to_all", "gather", "scatter"};

// Index == ncclDataType_t value.
static const char *const dtype_names[ncclNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};

// The API as function pointers: filled from the linked symbols or by dlsym.
#define API_LIST(X)                                                            \
  X(GetVersion) X(GetErrorString) X(CommInitRank) X(CommInitRankConfig)        \
  X(CommSplit) X(CommDestroy) X(AllReduce) X(AllGather) X(ReduceScatter)       \
  X(Broadcast) X(Bcast) X(Reduce) X(Send) X(Recv) X(AlltoAll) X(Gather)        \
  X(Scatter) X(GroupStart) X(GroupEnd)
static struct {
#define X(n) __typeof__(&nccl##n) n;
  API_LIST(X)
#undef X
} api;

static struct {
  uint64_t calls[NKINDS]; // --calls totals, in command-line order below
  int order[NKINDS], norder;
  int threads;
  size_t count;
  int dtype; // -1: cycle through all
  int group;
  int have_seed;
  long seed;
  int nranks, rank;
  int init_config;
  int have_split, split_color;
  int print_id_hash;
  int fake_comm;
  const char *dlopen_path;
  const char *wait_file;
  long start_delay_ms;
  long duration_ms; // <0: one round
  long last_count;  // <0: none; else the count of each thread's last call of a round
  int root;         // of broadcast, bcast, reduce, gather, scatter
  int forks;
  int no_nccl;
  int main_exits;
  long linger_ms; // each worker, after its last call: say "lingering", sleep
  const char *again_file; // after the rounds: say "round done", wait for it, one round more
} opt = {.threads = 1, .count = 1024, .dtype = ncclFloat32, .nranks = 1,
         .duration_ms = -1, .last_count = -1};

static ncclComm_t comm; // what the calls use
static char sendbuf[64], recvbuf[64];
static volatile int stop; // --duration-ms: set by the serial thread
static pthread_barrier_t round_barrier;
static uint64_t rounds;
static int again; // --again-file: its round began

struct worker {
  pthread_t tid;
  int index;
  uint64_t share[NKINDS]; // this thread's calls per round
  uint64_t done[NKINDS];
  uint64_t errors;
  uint64_t seq; // calls made so far, picks the datatype for --dtype all
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: nccl_workload [options]\n"
          "  --calls KIND=N[,KIND=N...]  total calls per kind over all threads; kinds:\n"
          "      all_reduce all_gather reduce_scatter broadcast bcast reduce send recv\n"
          "      all_to_all gather scatter\n"
          "  --threads T          split the calls over T threads (default 1)\n"
          "  --count C            elements per call (default 1024)\n"
          "  --dtype NAME|all     int8 uint8 int32 uint32 int64 uint64 float16 float32\n"
          "                       float64 bfloat16 fp8e4m3 fp8e5m2 (default float32);\n"
          "                       all: call j of a thread uses datatype j %% 12\n"
          "  --group              wrap each thread's batch in ncclGroupStart/End\n"
          "  --init-seed S        ncclCommInitRank with id byte i = (uint8_t)(S*31 + i*7)\n"
          "  --nranks N --rank R  for --init-seed (default 1, 0)\n"
          "  --init-config        use ncclCommInitRankConfig instead\n"
          "  --split COLOR        then ncclCommSplit(comm, COLOR, R, &child, NULL) once\n"
          "  --print-id-hash      print id_hash=0x<commHash of the id>\n"
          "  --fake-comm          without --init-seed: comm = (ncclComm_t)0x1000 (stub only!)\n"
          "  --dlopen PATH        dlopen+dlsym PATH instead of the linked symbols\n"
          "  --wait-file PATH     once NCCL is loaded print 'ready pid=P', wait for PATH\n"
          "  --start-delay-ms M   sleep M ms before loading/starting\n"
          "  --duration-ms D      repeat the pattern until D ms have passed\n"
          "  --last-count C       each thread's last call of a round passes count C\n"
          "  --root R             the root of broadcast, bcast, reduce, gather, scatter (0)\n"
          "  --again-file PATH    after the rounds print 'round done pid=P', wait for\n"
          "                       PATH, then make one round more (twice --calls in all)\n"
          "  --linger-ms M        each worker thread, after its last call, prints\n"
          "                       'lingering tid=T' and sleeps M ms before it ends\n"
          "  --main-exits         the main thread hands the run to another thread and\n"
          "                       exits (pthread_exit); that thread starts once the main\n"
          "                       thread is a zombie, and ends the process\n"
          "  --fork N             run the pattern in N forked children (with --wait-file\n"
          "                       the parent waits for PATH before it forks)\n"
          "  --no-nccl            never load or call NCCL (with the linked build libnccl\n"
          "                       is still mapped at exec: combine with a dlopen-only build)\n");
}

static void bad_args(const char *what, const char *arg) {
  fprintf(stderr, "nccl_workload: bad %s '%s'\n", what, arg ? arg : "");
  usage(stderr);
  exit(2);
}

static long parse_long(const char *s, long min, const char *what) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min) bad_args(what, s);
  return v;
}

static void parse_calls(char *spec) {
  for (char *save, *tok = strtok_r(spec, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq) bad_args("--calls entry", tok);
    *eq = '\0';
    int k = 0;
    while (k < NKINDS && strcmp(tok, kind_names[k])) k++;
    if (k == NKINDS) bad_args("call kind", tok);
    long n = parse_long(eq + 1, 0, "call count");
    int seen = 0;
    for (int i = 0; i < opt.norder; i++) seen |= opt.order[i] == k;
    if (!seen) opt.order[opt.norder++] = k;
    opt.calls[k] += (uint64_t)n; // a kind given twice adds up
  }
}

static void parse_args(int argc, char **argv) {
  enum { O_CALLS = 256, O_THREADS, O_COUNT, O_DTYPE, O_GROUP, O_SEED, O_NRANKS,
         O_RANK, O_CONFIG, O_SPLIT, O_HASH, O_FAKE, O_DLOPEN, O_WAIT, O_DELAY,
         O_DURATION, O_FORK, O_NONCCL, O_LAST, O_ROOT, O_MAIN_EXITS, O_LINGER, O_AGAIN, O_HELP };
  static const struct option longopts[] = {
      {"calls", required_argument, 0, O_CALLS}, {"threads", required_argument, 0, O_THREADS},
      {"count", required_argument, 0, O_COUNT}, {"dtype", required_argument, 0, O_DTYPE},
      {"group", no_argument, 0, O_GROUP}, {"init-seed", required_argument, 0, O_SEED},
      {"nranks", required_argument, 0, O_NRANKS}, {"rank", required_argument, 0, O_RANK},
      {"init-config", no_argument, 0, O_CONFIG}, {"split", required_argument, 0, O_SPLIT},
      {"print-id-hash", no_argument, 0, O_HASH}, {"fake-comm", no_argument, 0, O_FAKE},
      {"dlopen", required_argument, 0, O_DLOPEN}, {"wait-file", required_argument, 0, O_WAIT},
      {"start-delay-ms", required_argument, 0, O_DELAY},
      {"duration-ms", required_argument, 0, O_DURATION}, {"last-count", required_argument, 0, O_LAST},
      {"root", required_argument, 0, O_ROOT},
      {"fork", required_argument, 0, O_FORK}, {"no-nccl", no_argument, 0, O_NONCCL},
      {"main-exits", no_argument, 0, O_MAIN_EXITS}, {"linger-ms", required_argument, 0, O_LINGER},
      {"again-file", required_argument, 0, O_AGAIN},
      {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case O_CALLS: parse_calls(optarg); break;
    case O_THREADS: opt.threads = (int)parse_long(optarg, 1, "--threads"); break;
    case O_COUNT: opt.count = (size_t)parse_long(optarg, 0, "--count"); break;
    case O_DTYPE:
      opt.dtype = -2;
      if (!strcmp(optarg, "all")) opt.dtype = -1;
      for (int i = 0; i < ncclNumTypes; i++)
        if (!strcmp(optarg, dtype_names[i])) opt.dtype = i;
      if (opt.dtype == -2) bad_args("--dtype", optarg);
      break;
    case O_GROUP: opt.group = 1; break;
    case O_SEED: opt.have_seed = 1; opt.seed = parse_long(optarg, LONG_MIN, "--init-seed"); break;
    case O_NRANKS: opt.nranks = (int)parse_long(optarg, INT_MIN, "--nranks"); break;
    case O_RANK: opt.rank = (int)parse_long(optarg, INT_MIN, "--rank"); break;
    case O_CONFIG: opt.init_config = 1; break;
    case O_SPLIT: opt.have_split = 1; opt.split_color = (int)parse_long(optarg, INT_MIN, "--split"); break;
    case O_HASH: opt.print_id_hash = 1; break;
    case O_FAKE: opt.fake_comm = 1; break;
    case O_DLOPEN: opt.dlopen_path = optarg; break;
    case O_WAIT: opt.wait_file = optarg; break;
    case O_DELAY: opt.start_delay_ms = parse_long(optarg, 0, "--start-delay-ms"); break;
    case O_DURATION: opt.duration_ms = parse_long(optarg, 0, "--duration-ms"); break;
    case O_LAST: opt.last_count = parse_long(optarg, 0, "--last-count"); break;
    case O_ROOT: opt.root = (int)parse_long(optarg, 0, "--root"); break;
    case O_FORK: opt.forks = (int)parse_long(optarg, 1, "--fork"); break;
    case O_NONCCL: opt.no_nccl = 1; break;
    case O_MAIN_EXITS: opt.main_exits = 1; break;
    case O_LINGER: opt.linger_ms = parse_long(optarg, 0, "--linger-ms"); break;
    case O_AGAIN: opt.again_file = optarg; break;
    case O_HELP: usage(stdout); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  if (optind < argc) bad_args("argument", argv[optind]);
  if (!opt.have_seed && (opt.init_config || opt.have_split || opt.print_id_hash))
    bad_args("option without --init-seed", "--init-config/--split/--print-id-hash");
  if (opt.have_seed && opt.fake_comm) bad_args("combination", "--init-seed with --fake-comm");
  if (opt.main_exits && opt.forks) bad_args("combination", "--main-exits with --fork");
#ifdef NCCL_WORKLOAD_DLOPEN_ONLY
  if (!opt.dlopen_path && !opt.no_nccl) bad_args("build", "dlopen-only build needs --dlopen");
#endif
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

// Exits 1 on failure: a library that cannot be loaded is no bad argument.
static void load_nccl(void) {
  if (opt.dlopen_path) {
    void *h = dlopen(opt.dlopen_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "nccl_workload: dlopen: %s\n", dlerror());
      exit(1);
    }
#define X(n)                                                                   \
  if (!(*(void **)&api.n = dlsym(h, "nccl" #n))) {                             \
    fprintf(stderr, "nccl_workload: dlsym nccl" #n ": %s\n", dlerror());       \
    exit(1);                                                                   \
  }
    API_LIST(X)
#undef X
  } else {
#ifndef NCCL_WORKLOAD_DLOPEN_ONLY
#define X(n) api.n = &nccl##n;
    API_LIST(X)
#undef X
#endif
  }
}

static void make_id(ncclUniqueId *id) {
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    id->internal[i] = (char)(uint8_t)(opt.seed * 31 + i * 7);
}

// NCCL's commHash: DJB2a over the id bytes as signed chars.
static uint64_t id_hash(const ncclUniqueId *id) {
  uint64_t h = 5381;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    h = (h * 33) ^ (uint64_t)(int64_t)(signed char)id->internal[i];
  return h;
}

static ncclResult_t call_one(int k, ncclDataType_t dt, size_t n) {
  int peer = opt.nranks > 1 ? (opt.rank + 1) % opt.nranks : 0;
  switch (k) {
  case ALL_REDUCE: return api.AllReduce(sendbuf, recvbuf, n, dt, ncclSum, comm, NULL);
  case ALL_GATHER: return api.AllGather(sendbuf, recvbuf, n, dt, comm, NULL);
  case REDUCE_SCATTER: return api.ReduceScatter(sendbuf, recvbuf, n, dt, ncclSum, comm, NULL);
  case BROADCAST: return api.Broadcast(sendbuf, recvbuf, n, dt, opt.root, comm, NULL);
  case BCAST: return api.Bcast(recvbuf, n, dt, opt.root, comm, NULL);
  case REDUCE: return api.Reduce(sendbuf, recvbuf, n, dt, ncclSum, opt.root, comm, NULL);
  case SEND: return api.Send(sendbuf, n, dt, peer, comm, NULL);
  case RECV: return api.Recv(recvbuf, n, dt, peer, comm, NULL);
  case ALL_TO_ALL: return api.AlltoAll(sendbuf, recvbuf, n, dt, comm, NULL);
  case GATHER: return api.Gather(sendbuf, recvbuf, n, dt, opt.root, comm, NULL);
  default: return api.Scatter(sendbuf, recvbuf, n, dt, opt.root, comm, NULL);
  }
}

static void run_round(struct worker *w) {
  uint64_t left[NKINDS], remaining = 0;
  memcpy(left, w->share, sizeof left);
  for (int k = 0; k < NKINDS; k++) remaining += left[k];
  if (opt.group) api.GroupStart();
  for (int more = 1; more;) {
    more = 0;
    for (int i = 0; i < opt.norder; i++) {
      int k = opt.order[i];
      if (!left[k]) continue;
      ncclDataType_t dt = (ncclDataType_t)(opt.dtype < 0 ? (int)(w->seq % ncclNumTypes) : opt.dtype);
      size_t n = remaining-- == 1 && opt.last_count >= 0 ? (size_t)opt.last_count : opt.count;
      if (call_one(k, dt, n) != ncclSuccess) w->errors++;
      w->done[k]++;
      w->seq++;
      more |= --left[k] != 0;
    }
  }
  if (opt.group) api.GroupEnd(); // its result is not a counted call
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  char name[16];
  snprintf(name, sizeof name, "nccl-worker-%d", w->index); // shown per thread by commdbg
  pthread_setname_np(pthread_self(), name);
  uint64_t deadline = opt.duration_ms >= 0 ? now_ms() + (uint64_t)opt.duration_ms : 0;
  for (;;) {
    run_round(w);
    // Rounds end together, so calls == rounds * --calls exactly.
    if (pthread_barrier_wait(&round_barrier) == PTHREAD_BARRIER_SERIAL_THREAD) {
      rounds++;
      stop = opt.duration_ms < 0 || now_ms() >= deadline;
      if (stop && opt.again_file && !again) { // one round more, once the file exists
        again = 1;
        stop = 0;
        printf("round done pid=%d\n", (int)getpid());
        fflush(stdout);
        while (access(opt.again_file, F_OK)) sleep_ms(1);
      }
    }
    pthread_barrier_wait(&round_barrier);
    if (stop) break;
  }
  if (opt.linger_ms) {
    printf("lingering tid=%ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    sleep_ms(opt.linger_ms);
  }
  return NULL;
}

// One process's whole run: load, wait, init, calls, report.
static int run_process(void) {
  if (!opt.no_nccl) load_nccl();
  if (opt.wait_file) {
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    while (access(opt.wait_file, F_OK)) sleep_ms(1);
  }
  int version = 0;
  uint64_t done[NKINDS] = {0}, errors = 0;
  if (opt.no_nccl) {
    if (opt.duration_ms > 0) sleep_ms(opt.duration_ms);
    goto report;
  }

  api.GetVersion(&version);
  ncclComm_t parent = NULL, child = NULL;
  if (opt.have_seed) {
    ncclUniqueId id;
    make_id(&id);
    ncclResult_t r;
    if (opt.init_config) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      r = api.CommInitRankConfig(&parent, opt.nranks, id, opt.rank, &cfg);
    } else {
      r = api.CommInitRank(&parent, opt.nranks, id, opt.rank);
    }
    fprintf(stderr, "nccl_workload: init rc=%d (%s)\n", r, api.GetErrorString(r));
    comm = parent;
    if (opt.have_split) {
      r = api.CommSplit(parent, opt.split_color, opt.rank, &child, NULL);
      fprintf(stderr, "nccl_workload: split rc=%d (%s)\n", r, api.GetErrorString(r));
      if (r != ncclSuccess) child = NULL; // never trust an output after a failure
      if (child) comm = child;
    }
  } else if (opt.fake_comm) {
    comm = (ncclComm_t)(uintptr_t)0x1000; // stub only: it never dereferences a comm
  }

  struct worker *ws = calloc((size_t)opt.threads, sizeof *ws);
  if (!ws) return 1;
  pthread_barrier_init(&round_barrier, NULL, (unsigned)opt.threads);
  for (int t = 0; t < opt.threads; t++) {
    ws[t].index = t;
    for (int k = 0; k < NKINDS; k++) // thread t: N/T, plus one of the remainder
      ws[t].share[k] = opt.calls[k] / (uint64_t)opt.threads +
                       ((uint64_t)t < opt.calls[k] % (uint64_t)opt.threads);
  }
  for (int t = 0; t < opt.threads; t++)
    if (pthread_create(&ws[t].tid, NULL, worker_main, &ws[t])) {
      fprintf(stderr, "nccl_workload: pthread_create failed\n");
      exit(1);
    }
  for (int t = 0; t < opt.threads; t++) {
    pthread_join(ws[t].tid, NULL);
    for (int k = 0; k < NKINDS; k++) done[k] += ws[t].done[k];
    errors += ws[t].errors;
  }
  free(ws);
  pthread_barrier_destroy(&round_barrier);
  // Tidy up as a real job would; these calls are not counted in "calls".
  if (child) api.CommDestroy(child);
  if (parent) api.CommDestroy(parent);

report:
  printf("{\"pid\":%d,\"calls\":{", (int)getpid());
  for (int k = 0; k < NKINDS; k++)
    printf("%s\"%s\":%" PRIu64, k ? "," : "", kind_names[k], done[k]);
  printf("},\"errors\":%" PRIu64 ",\"version\":%d,\"rounds\":%" PRIu64 "}\n", errors, version,
         rounds);
  fflush(stdout);
  return 0;
}

// --main-exits: the process's main thread is a zombie once its task's stat
// says Z; then the rest runs here, as a process whose main thread exited.
static void *run_after_main(void *arg) {
  (void)arg;
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)getpid());
  for (;;) {
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
    char *paren = strrchr(text, ')');
    if (paren && paren[1] == ' ' && paren[2] == 'Z') break;
    sleep_ms(1);
  }
  exit(run_process());
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  if (opt.main_exits) {
    pthread_t t;
    if (pthread_create(&t, NULL, run_after_main, NULL)) {
      fprintf(stderr, "nccl_workload: pthread_create failed\n");
      return 1;
    }
    pthread_exit(NULL);
  }
  if (opt.print_id_hash) { // needs no NCCL: the tracer's expected comm id
    ncclUniqueId id;
    make_id(&id);
    printf("id_hash=0x%016" PRIx64 "\n", id_hash(&id));
    fflush(stdout);
  }
  if (opt.start_delay_ms) sleep_ms(opt.start_delay_ms);
  if (!opt.forks) return run_process();

  if (opt.wait_file) { // the parent waits, so a tracer can attach before the forks
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    while (access(opt.wait_file, F_OK)) sleep_ms(1);
    opt.wait_file = NULL;
  }
  fflush(stdout); // children must not repeat buffered output
  for (int i = 0; i < opt.forks; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("nccl_workload: fork");
      return 1;
    }
    if (pid == 0) _exit(run_process());
  }
  int failed = 0, status;
  while (wait(&status) > 0)
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (failed) fprintf(stderr, "nccl_workload: a child failed\n");
  return failed;
}
