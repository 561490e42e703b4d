/* moe_ep.h: the public C ABI of libmoe_ep.so (ABI v1).
 *
 * An engine dlopens the library, looks up the exported table
 * `moe_ep_plugin_v1` (see moe_ep_loader.h) and calls everything through it.
 * Every public struct starts with `size_t struct_size`: the library reads
 * only the fields that fit in that size and uses defaults for the fields
 * past it, so old engines keep working when fields are appended. Fields
 * within the size are read as written: MOE_EP_INIT zeroes them, and a zero
 * is not a default where the field says so (see moe_ep_config_t). Fields
 * are only ever appended; tests/plugin/abi_layout_test.cc pins every offset.
 */
#ifndef MOE_EP_H_
#define MOE_EP_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_EP_ABI_VERSION 1u
#define MOE_EP_VERSION_MAJOR 0
#define MOE_EP_VERSION_MINOR 5
#define MOE_EP_VERSION_PATCH 1

/* ---- status ------------------------------------------------------------ */

typedef enum moe_ep_status {
  MOE_EP_OK = 0,
  MOE_EP_ERR_INVALID_ARGUMENT = 1, /* a parameter broke a documented rule */
  MOE_EP_ERR_CONFIG = 2,           /* YAML / config value rejected */
  MOE_EP_ERR_UNSUPPORTED = 3,      /* valid request this build/backend lacks */
  MOE_EP_ERR_NO_MEMORY = 4,
  MOE_EP_ERR_BOOTSTRAP = 5,        /* group could not form within timeout */
  MOE_EP_ERR_PEER_FAILED = 6,      /* a peer died or vanished mid-operation */
  MOE_EP_ERR_TIMEOUT = 7,          /* a bounded wait expired */
  MOE_EP_ERR_MISMATCH = 8,         /* ranks disagree (config hash, versions) */
  MOE_EP_ERR_CUDA = 9,
  MOE_EP_ERR_NCCL = 10,
  MOE_EP_ERR_UCX = 11,
  MOE_EP_ERR_BUSY = 12,            /* the op's buffer set still holds an unrun hook */
  MOE_EP_ERR_INTERNAL = 13,
  MOE_EP_STATUS_COUNT_ = 14
} moe_ep_status_t;

/* Which statuses fail a group: PEER_FAILED, TIMEOUT, MISMATCH, CUDA, NCCL,
 * UCX and INTERNAL. When an entry on a group returns one of them, or
 * hook_free abandons an nccl low_latency receive (MISMATCH; see hook_run),
 * the group is failed for good: from then on prepare, dispatch, combine,
 * hook_run, handle_layout and group_poll_error return that status with the
 * first failure's sentence, and the engine destroys the group
 * (group_destroy). group_info, set_num_sms, max_sms_used and
 * group_busy_hook still answer.
 * The other statuses (INVALID_ARGUMENT, CONFIG, UNSUPPORTED, NO_MEMORY,
 * BUSY) do not fail the group.
 *
 * BUSY: operations take the group's buffer sets in turn (two with
 * double_buffer, else one), and an operation whose set still holds a
 * deferred operation whose hook has not run is refused. With double_buffer
 * that is the third operation while the first hook is pending; without it,
 * the second. group_busy_hook (0.4) names the hook a refusal waits for. */

/* ---- tensors ----------------------------------------------------------- */

/* Layout-identical to DLPack's DLTensor (tests/plugin/abi_layout_test.cc checks
 * this against <dlpack/dlpack.h>), so a DLTensor* casts to it directly. */
typedef enum moe_ep_device_type {
  MOE_EP_DEVICE_CPU = 1,       /* kDLCPU */
  MOE_EP_DEVICE_CUDA = 2,      /* kDLCUDA */
  MOE_EP_DEVICE_CUDA_HOST = 3  /* kDLCUDAHost */
} moe_ep_device_type_t;

typedef enum moe_ep_dtype_code {
  MOE_EP_DTYPE_INT = 0,        /* kDLInt */
  MOE_EP_DTYPE_UINT = 1,       /* kDLUInt */
  MOE_EP_DTYPE_FLOAT = 2,      /* kDLFloat */
  MOE_EP_DTYPE_BFLOAT = 4,     /* kDLBfloat */
  MOE_EP_DTYPE_FLOAT8_E4M3FN = 10 /* kDLFloat8_e4m3fn (DLPack >= 1.1) */
} moe_ep_dtype_code_t;

typedef struct moe_ep_device {
  int32_t device_type; /* moe_ep_device_type_t */
  int32_t device_id;
} moe_ep_device_t;

typedef struct moe_ep_data_type {
  uint8_t code; /* moe_ep_dtype_code_t */
  uint8_t bits;
  uint16_t lanes;
} moe_ep_data_type_t;

typedef struct moe_ep_tensor {
  void *data;
  moe_ep_device_t device;
  int32_t ndim;
  moe_ep_data_type_t dtype;
  int64_t *shape;
  int64_t *strides; /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} moe_ep_tensor_t;

/* What every entry checks of a tensor, refusing a break with
 * MOE_EP_ERR_INVALID_ARGUMENT:
 *   - memory: on the host backend CPU or CUDA_HOST (pinned) memory; on the
 *     nccl backend CUDA memory of the group's device (device_id checked);
 *   - dtype with lanes 1, and the shape the entry names;
 *   - compact row-major layout: strides NULL, or the compact strides (a
 *     dimension of size 1 may have any stride; other views are refused);
 *   - alignment of data + byte_offset: 16 bytes for bf16 and fp8 tensors
 *     (the kernels move whole 16-byte vectors), the element size for the
 *     others;
 *   - within one dispatch or combine, a tensor the call writes shares no
 *     byte with another of its tensors (e.g. combine's out with its y, or
 *     dispatch's recv_x with its x): the kernels read and write them at
 *     once, in no fixed order. */

/* ---- configuration ----------------------------------------------------- */

typedef enum moe_ep_backend {
  MOE_EP_BACKEND_AUTO = 0, /* nccl when a CUDA device is present, else host;
                              nccl then needs libnccl.so.2: without it
                              group_create returns MOE_EP_ERR_NCCL (no
                              fallback to host) */
  MOE_EP_BACKEND_HOST = 1,
  MOE_EP_BACKEND_NCCL = 2
} moe_ep_backend_t;

typedef enum moe_ep_mode {
  MOE_EP_MODE_LOW_LATENCY = 0,
  MOE_EP_MODE_HIGH_THROUGHPUT = 1
} moe_ep_mode_t;

typedef enum moe_ep_dispatch_dtype {
  MOE_EP_DISPATCH_BF16 = 0,
  MOE_EP_DISPATCH_FP8_E4M3 = 1
} moe_ep_dispatch_dtype_t;

typedef enum moe_ep_fp8_scale {
  MOE_EP_FP8_SCALE_F32 = 0,         /* one f32 scale per 128 channels */
  MOE_EP_FP8_SCALE_UE8M0 = 1,       /* power-of-two scales, f32 storage */
  MOE_EP_FP8_SCALE_UE8M0_PACKED = 2 /* power-of-two, 4 exponents per int32 */
} moe_ep_fp8_scale_t;

/* fp8 dispatch, per 128-channel group of a token row:
 *   scale = max(amax, 1e-4) / 448, rounded up to a power of two for UE8M0
 *   formats and with MOE_EP_FLAG_ROUND_SCALE; q = e4m3(x / scale), round to
 *   nearest even, saturating at +-448.
 * Non-finite input, the same on every backend and scale format:
 *   - amax is taken over the group's finite values only, so an inf or NaN
 *     never changes the scale of its 127 neighbours;
 *   - +inf / -inf arrive as +448 / -448 (codes 0x7E / 0xFE);
 *   - NaN of either sign arrives as NaN, code 0x7F;
 *   - a group with no finite value (or only zeros) gets the floor's scale,
 *     1e-4 / 448 as f32, 2^-22 (UE8M0 byte 105) as a power of two. */

typedef enum moe_ep_transport {
  MOE_EP_TRANSPORT_AUTO = 0,
  MOE_EP_TRANSPORT_LSA = 1,
  MOE_EP_TRANSPORT_GIN = 2,
  MOE_EP_TRANSPORT_GIN_EMULATED = 3,
  MOE_EP_TRANSPORT_UCX_HOST = 4 /* host backend: UCX active messages (reported only) */
} moe_ep_transport_t;

typedef enum moe_ep_log_level {
  MOE_EP_LOG_NONE = 0,
  MOE_EP_LOG_ERROR = 1,
  MOE_EP_LOG_WARN = 2,
  MOE_EP_LOG_INFO = 3,
  MOE_EP_LOG_DEBUG = 4,
  MOE_EP_LOG_TRACE = 5
} moe_ep_log_level_t;

/* A dispatch's row format, chosen per call (moe_ep_dispatch_params_t.format,
 * as DeepEP's use_fp8 / use_ue8m0 are). Low latency: a group's buffers hold
 * rows of its configured dispatch_dtype, and fp8 rows fit a bf16 group's
 * buffers, so a group configured bf16 takes every format; a group
 * configured fp8 refuses format BF16 with MOE_EP_ERR_UNSUPPORTED. An fp8
 * format needs the call's hidden to be a multiple of 128 (one scale per 128
 * channels; FP8_PER_TOKEN keeps the same rule), else INVALID_ARGUMENT: a
 * bf16 group whose hidden is 2880 takes bf16 rows only. High throughput ignores dispatch_dtype: its rows follow
 * x's dtype (see x_scales), and fp8_scale names the scales of format GROUP
 * with an fp8 x. An HT group configured fp8_e4m3 still needs its config
 * hidden to be a multiple of 128. FP8_PER_TOKEN names rows that carry one
 * scale each (DeepEP's [T, 1] scales); only high throughput takes it, and
 * low latency, which quantises per 128 channels itself, refuses it with
 * INVALID_ARGUMENT. */
typedef enum moe_ep_dispatch_format {
  MOE_EP_FORMAT_GROUP = 0,          /* the group's dispatch_dtype and fp8_scale */
  MOE_EP_FORMAT_BF16 = 1,
  MOE_EP_FORMAT_FP8_F32 = 2,        /* fp8 e4m3, one f32 scale per 128 channels */
  MOE_EP_FORMAT_FP8_UE8M0 = 3,      /* power-of-two scales in f32 storage */
  MOE_EP_FORMAT_FP8_UE8M0_PACKED = 4, /* power-of-two, 4 exponents per int32 */
  MOE_EP_FORMAT_FP8_PER_TOKEN = 5     /* 0.5, HT only: fp8 e4m3 the engine
                                         quantised, one f32 scale per row */
} moe_ep_dispatch_format_t;

#define MOE_EP_ADDRESS_MAX 256
#define MOE_EP_ENV_NAME_MAX 64

/* The effective configuration: what the engine's YAML `moe_ep:` section
 * says, with defaults filled in and MOE_EP_<KEY> environment overrides
 * applied. Build one with `config_from_yaml` (the text "moe_ep: {}" gives
 * every default); only it applies the overrides, and an empty variable
 * counts as unset.
 * A struct the engine fills itself gets no MOE_EP_<KEY> overrides
 * (MOE_EP_LOG_LEVEL still sets the log level: the logger reads it), and gets
 * defaults only for the fields past its struct_size; every field within it
 * is read as written and checked (MOE_EP_ERR_CONFIG naming the key, as for
 * YAML): a struct from MOE_EP_INIT has num_experts 0 and is refused. To
 * start from the defaults, set fields in the struct
 * config_from_yaml("moe_ep: {}") returns. A struct_size that does not reach
 * through log_level is INVALID_ARGUMENT.
 * Ranks must agree on every key but bootstrap.address,
 * bootstrap.timeout_ms, bootstrap.token_env and log_level: group_create
 * compares the others (backend as resolved from auto) and fails with
 * MOE_EP_ERR_MISMATCH naming the first key that differs. Ranks with
 * different bootstrap.timeout_ms give up at different times. */
typedef struct moe_ep_config {
  size_t struct_size;
  int32_t backend;          /* moe_ep_backend_t */
  int32_t mode;             /* moe_ep_mode_t */
  int32_t num_experts;      /* global expert count */
  int32_t hidden;           /* max hidden size of any layer */
  int32_t top_k;            /* max top_k of any layer */
  int32_t max_tokens_per_rank;
  int32_t dispatch_dtype;   /* moe_ep_dispatch_dtype_t */
  int32_t fp8_scale;        /* moe_ep_fp8_scale_t */
  int32_t double_buffer;    /* 0 or 1: two buffer sets for hooks */
  int32_t transport;        /* moe_ep_transport_t */
  int32_t bootstrap_timeout_ms;
  int32_t kernel_timeout_ms;
  int32_t log_level;        /* moe_ep_log_level_t */
  char bootstrap_address[MOE_EP_ADDRESS_MAX]; /* "host:port" of rank 0 */
  char bootstrap_token_env[MOE_EP_ENV_NAME_MAX]; /* env var holding the job token */
  /* ---- appended in 0.3 ---- */
  /* The struct used to end above with 4 bytes of tail padding (sizeof
   * 384), which an engine built against that header covers with its
   * struct_size without writing them: nothing is kept there, so every later
   * field lies past 384 and such an engine gets its default. */
  int32_t reserved0;        /* never read */
  /* Consecutive ranks that share one node (NVLink domain): ranks r and q
   * are on the same node when r / ranks_per_node == q / ranks_per_node.
   * 0 (default) = unset; > 0 must divide world_size. Read by HT on the nccl
   * backend with transport gin / gin_emulated: peers on other nodes through
   * the network protocol, peers on the same node by NVLink stores; unset
   * there means every rank is its own node (gin_emulated) or NCCL's LSA
   * team decides (gin). With transport lsa / auto the group is one node,
   * so HT takes only 0 or world_size. Set, it also fixes HT combine's sum
   * order on every backend (per node, then across nodes: see
   * moe_ep_combine_params_t.out). LL ignores it (one transport to every
   * peer). A value outside 0..1024 is a config value rejected
   * (MOE_EP_ERR_CONFIG, as every out-of-range field, from YAML or from a
   * struct the engine filled); group_create refuses one that breaks these
   * rules for its world size with INVALID_ARGUMENT. */
  int32_t ranks_per_node;
  int32_t reserved1;        /* never read; names the tail padding (8-byte
                               alignment), so the next field goes after it */
} moe_ep_config_t;

/* ---- group ------------------------------------------------------------- */

typedef struct moe_ep_group moe_ep_group_t;   /* opaque */
typedef struct moe_ep_handle moe_ep_handle_t; /* opaque: one routing layout */
typedef struct moe_ep_hook moe_ep_hook_t;     /* opaque: a deferred receive */

typedef void (*moe_ep_logger_fn)(void *user, int level, const char *message);

/* rank / world_size < 0 mean "read MOE_EP_RANK / MOE_EP_WORLD_SIZE"
 * (the launcher sets them). */
typedef struct moe_ep_group_params {
  size_t struct_size;
  const moe_ep_config_t *config; /* borrowed for the call only */
  int32_t rank;
  int32_t world_size;
  int32_t cuda_device;           /* < 0: current device (nccl backend) */
  int32_t reserved0;
  /* Optional engine ncclComm_t for the EP group (nccl backend), borrowed.
   * NCCL's collective steps on it during group_create and group_destroy
   * (window registration, device communicator) are bounded only as the
   * engine configured it: on a blocking communicator they wait for every
   * peer, a dead one too. A communicator moe-ep creates is nonblocking and
   * every such step is bounded by bootstrap.timeout_ms. One whose rank or
   * rank count differs from the group's: MOE_EP_ERR_MISMATCH. Set on a group
   * whose backend is host (configured, or auto without a CUDA device):
   * MOE_EP_ERR_INVALID_ARGUMENT. */
  void *nccl_comm;
} moe_ep_group_params_t;

#define MOE_EP_TRANSPORT_NAME_MAX 16

typedef struct moe_ep_group_info {
  size_t struct_size;
  int32_t rank;
  int32_t world_size;
  int32_t num_local_experts;
  int32_t backend;              /* moe_ep_backend_t actually chosen */
  int32_t mode;
  int32_t num_sms;              /* SMs the kernels may use (0 on host) */
  uint64_t bytes_allocated;     /* communication buffers this rank holds */
  uint64_t config_hash;         /* canonical hash of the effective config */
  /* transport per peer (moe_ep_transport_t), world_size entries; may be
   * NULL to skip; the caller owns the array. LL runs one transport to
   * every peer, so its entries (self aside) are all that one. */
  int32_t *peer_transports;
  int32_t peer_transports_len;
  int32_t reserved0;
} moe_ep_group_info_t;

/* ---- operations -------------------------------------------------------- */

#define MOE_EP_FLAG_DEFER_RECV (1u << 0) /* launch send half, return a hook */
#define MOE_EP_FLAG_ROUND_SCALE (1u << 1) /* LL dispatch of fp8 rows:
                                             power-of-two scales. Accepted
                                             and ignored by HT dispatch
                                             (HT never quantises), by bf16
                                             rows and by combine */
/* 0.3, HT dispatch only (DeepEP's num_worst_tokens > 0): outputs sized for
 * the worst case, so the call needs no receive count on the host and can be
 * captured in a CUDA graph. The receive tensors (recv_x, recv_scales,
 * recv_topk_idx, recv_topk_weights) must have at least
 * world_size * max_tokens_per_rank rows, so no receive can overflow them;
 * num_recv_tokens may be NULL; when given, the host backend fills N_recv
 * and the nccl backend -1 (learning N_recv on the host would take the sync
 * the flag exists to avoid). Rows at and past N_recv
 * get recv_topk_idx -1 and recv_topk_weights 0 (their recv_x and
 * recv_scales are unspecified); recv_count is as usual. The combine on that
 * handle then takes y with N_recv rows or more (rows past N_recv are
 * ignored), e.g. the dispatch's fixed-size output; on the nccl backend,
 * where N_recv stays on the GPU, y needs the dispatch's full row count.
 * Low-latency dispatch (always fixed-size) refuses it.
 * Without the flag, the nccl backend's HT receive learns N_recv on the
 * host: it waits until the dispatch's stream has reached the kernel
 * (within bootstrap.timeout_ms: the engine's earlier work on that stream),
 * then until the kernel ends (within 4 x timeouts.kernel_ms), and returns
 * MOE_EP_ERR_TIMEOUT past either; a receive tensor with fewer rows than
 * N_recv makes it return MOE_EP_ERR_INVALID_ARGUMENT for that call (the
 * rows were dropped). That refusal is this rank's alone, learnt after
 * every peer's send: the peers' dispatches return OK, so the engine must
 * skip that layer call's combine on every rank (a peer's combine of it
 * waits for this rank's rows until timeouts.kernel_ms, then fails the
 * group); the host backend knows N_recv from prepare and refuses such a
 * tensor before sending, on every rank alike. Ranks whose calls
 * differ in hidden, top_k or row format (fp8 scale format included) all
 * refuse the call with MOE_EP_ERR_INVALID_ARGUMENT naming a rank that
 * differs and both shapes, the group usable and every rank skipping that
 * combine; if any rank's call carried this flag, the nccl backend cannot
 * refuse it on that rank, so every rank's group fails with MISMATCH instead
 * (worst-case rows all marked empty). */
#define MOE_EP_FLAG_WORST_CASE (1u << 2)

typedef struct moe_ep_prepare_params {
  size_t struct_size;
  const moe_ep_tensor_t *topk_idx; /* [T, K] int32/int64, -1 = no expert */
  int32_t num_tokens;              /* T; <= max_tokens_per_rank */
  int32_t top_k;                   /* K; <= config top_k */
  /* cudaStream_t (nccl): of the group's GPU's primary context (the
   * runtime API's streams) or a green context of that GPU, in every
   * entry; another is INVALID_ARGUMENT. Ignored on host, and by a prepare
   * that asks for no layout output (nothing is queued on it then, and the
   * per-layer prepare of decode pays no CUDA call to check it). */
  void *stream;
  /* Layout outputs, both modes (optional, may be NULL): */
  moe_ep_tensor_t *num_tokens_per_rank;   /* [R] int32 */
  moe_ep_tensor_t *num_tokens_per_expert; /* [E] int32 */
  moe_ep_tensor_t *is_token_in_rank;      /* [T, R] uint8 */
} moe_ep_prepare_params_t;

/* HT dispatch is called again on the same handle for "the same layout as
 * before" (DeepEP's dispatch(handle=...), e.g. a second tensor of the same
 * tokens): each dispatch on an HT handle whose previous dispatch completed
 * sends its own x along the handle's layout, and the combine that follows
 * uses the latest dispatch. While a combine of the handle waits in its
 * hook (DEFER_RECV), a dispatch on the handle is INVALID_ARGUMENT: that
 * receive answers the dispatch before. An LL handle takes one dispatch. */
typedef struct moe_ep_dispatch_params {
  size_t struct_size;
  uint32_t flags;              /* MOE_EP_FLAG_* */
  int32_t hidden;              /* this layer's hidden (<= config hidden) */
  /* [T, H]. LL: bf16 (dispatch quantises it when the format is fp8). HT:
   * bf16, or fp8 e4m3 (dtype code MOE_EP_DTYPE_FLOAT8_E4M3FN, 8 bits)
   * quantised by the engine, with x_scales (see x_scales below). */
  const moe_ep_tensor_t *x;
  void *stream;
  /* LL outputs: */
  moe_ep_tensor_t *recv_x;      /* [E_local, R*max_tokens, H] bf16 or fp8;
                                   HT: [cap, H], x's dtype */
  moe_ep_tensor_t *recv_scales; /* [E_local, R*max_tokens, H/128] f32, or
                                   [E_local, R*max_tokens, H/512 rounded
                                   up] int32; HT with fp8 x: [cap, H/128]
                                   f32, [cap, H/512 rounded up] int32 or
                                   [cap, 1] f32 (FP8_PER_TOKEN), as
                                   x_scales */
  moe_ep_tensor_t *recv_count;  /* [E_local] int32 */
  /* [T, K] f32. HT: required input. LL: optional; when given, the weights
   * travel with the tokens and combine sums each token's experts on the
   * experts' ranks (one row back per (token, rank) instead of one per
   * (token, expert): top_k / ranks-per-token fewer combine bytes). The
   * tensor must then stay unchanged until the combine on this handle has
   * completed, like topk_idx. */
  const moe_ep_tensor_t *topk_weights;
  /* HT outputs: */
  moe_ep_tensor_t *recv_topk_idx;      /* [N_recv, K] int32 local id or -1 */
  moe_ep_tensor_t *recv_topk_weights;  /* [N_recv, K] f32 */
  /* host out: N_recv (HT). Written when the receive runs: with
   * MOE_EP_FLAG_DEFER_RECV in hook_run, so it must stay valid (not a stack
   * variable of a returned function) until the hook has run or been
   * freed. */
  int64_t *num_recv_tokens;
  /* Appended in 0.2 (absent in an older engine's struct = the group's
   * format): moe_ep_dispatch_format_t of this call's rows; recv_x and
   * recv_scales follow it. HT: see x_scales. */
  int32_t format;
  int32_t reserved0;
  /* Appended in 0.3 (absent = NULL). HT only: the scales of a pre-quantised
   * fp8 x (vLLM and SGLang quantise block-fp8 before an HT dispatch). HT
   * rows follow x's dtype and are never quantised by moe-ep: a bf16 x gives
   * bf16 rows (x_scales NULL, format GROUP or BF16); an fp8 x gives fp8
   * rows whose bytes and scales arrive exactly as sent (bit-exact, never
   * interpreted), with x_scales [T, H/128] f32 for format FP8_F32 or
   * FP8_UE8M0 (or GROUP when the group's fp8_scale is f32 or ue8m0),
   * [T, H/512] int32 (four UE8M0 bytes per word, H/512 rounded up) for
   * FP8_UE8M0_PACKED (or GROUP with fp8_scale ue8m0_packed), and [T, 1]
   * f32 for FP8_PER_TOKEN (0.5; an older library refuses format 5); format BF16
   * with an fp8 x, or an fp8 format with a bf16 x, is INVALID_ARGUMENT.
   * recv_x and recv_scales then have x's and x_scales' dtype and columns.
   * fp8 needs H a multiple of 128. Low-latency dispatch quantises bf16 x
   * itself and refuses x_scales. */
  const moe_ep_tensor_t *x_scales;
} moe_ep_dispatch_params_t;

typedef struct moe_ep_combine_params {
  size_t struct_size;
  uint32_t flags;                      /* DEFER_RECV; ROUND_SCALE is ignored */
  int32_t hidden;                      /* the dispatch's hidden on this handle,
                                          else INVALID_ARGUMENT */
  const moe_ep_tensor_t *y;            /* LL: [E_local, R*max_tokens, H];
                                          HT: [N_recv, H] bf16 */
  /* LL: [T, K] f32. Required unless the dispatch on this handle was given
   * topk_weights; then NULL or that same tensor (another tensor is
   * INVALID_ARGUMENT: the weights were already applied). HT: not read (the
   * experts applied the weights to y). */
  const moe_ep_tensor_t *topk_weights;
  /* [T, H] bf16 = sum_k w_k * y_k, in a fixed order (bit-identical on
   * every backend and transport, and wherever the weights were given):
   * each term fmaf(w, y, acc) into f32 from +0, -1 slots skipped, bf16
   * round-to-nearest-even. LL: per rank the sum of its slots in k order,
   * rounded to bf16; those partials summed in f32 from +0 in the order
   * their ranks first appear in the token's top-k. (README, "Routing
   * weights may be given to the LL dispatch".)
   * HT: the token's rows, one per rank it reached, summed in f32 from +0
   * in ascending rank order, rounded to bf16 once. When ranks_per_node is
   * set, each node's rows are summed first (ranks ascending, from +0), and
   * then the node sums (nodes ascending, from +0): the nccl backend forms
   * a remote node's sum there, on one GPU, and sends it once. With nodes
   * of one rank, or one node, that is the plain ascending sum. */
  moe_ep_tensor_t *out;
  void *stream;
} moe_ep_combine_params_t;

/* Appended in 0.3: the slot layout of an LL handle's dispatch, as DeepEP's
 * LL handle (src_info, layout_range, ...) exposes it (DeepEP's own tests
 * read it). Slot order is the same on every backend: per local expert,
 * source rank ascending, then token ascending (kernels/ll/PROTOCOL.md, "Slot
 * order"), so each source's slots are one contiguous range. Either output
 * may be NULL. */
typedef struct moe_ep_handle_layout_params {
  size_t struct_size;
  moe_ep_tensor_t *src_info;     /* [E_local, R*max_tokens] int32: the source
                                    token (its row in the source rank's x) of
                                    each received slot; -1 past recv_count */
  moe_ep_tensor_t *layout_range; /* [E_local, R] int64: begin << 32 | count of
                                    each source rank's slots; begin = the
                                    counts of the lower sources summed */
  void *stream;                  /* nccl: the stream the copy runs on */
} moe_ep_handle_layout_params_t;

/* ---- threads ----------------------------------------------------------- *
 *
 * Every entry may be called from any host thread.
 * - Entries that take a group, handle or hook (prepare, dispatch, combine,
 *   hook_run, hook_free, handle_free, handle_layout, group_poll_error,
 *   group_info, set_num_sms, max_sms_used, group_busy_hook) are serialised
 *   per group by one
 *   lock, so they may run concurrently on one group: an engine's overlap
 *   scheduler may run micro-batch A's hook on thread B while thread A
 *   dispatches or combines micro-batch B, and may free handles and hooks
 *   from either thread. The lock is held while a backend launches (nccl) or moves
 *   (host) a send or receive half, so a concurrent entry waits for it
 *   (bounded by timeouts.kernel_ms on the host backend, plus up to
 *   3 seconds after a send that failed, while it cuts its
 *   connections so that no send outlives the call; a high-throughput
 *   prepare there exchanges counts over the bootstrap, bounded by
 *   bootstrap.timeout_ms; an nccl high-throughput dispatch that learns its
 *   received row count on the host holds it until that count is in, up to
 *   bootstrap.timeout_ms plus 4 x timeouts.kernel_ms).
 * - Freeing a handle or hook while another thread uses it in an entry is
 *   safe: the entry finishes with it first, or finds it gone and returns
 *   INVALID_ARGUMENT (a freed handle's or hook's address is kept from new
 *   ones for the next 256 frees, so a stale pointer is not taken for a new
 *   object at the same address). Entries on different groups never wait
 *   for each other.
 * - group_create is collective and group_destroy must not race any other
 *   entry on the same group, handle_free and hook_free of its handles and
 *   hooks included; handles and hooks may outlive their group (free them
 *   after group_destroy has returned; a hook of a destroyed group reports
 *   it).
 * - last_error is per thread: read it on the thread whose entry failed.
 * - set_logger returns only after every call of the logger it replaced
 *   that is running on other threads has returned, so after
 *   set_logger(NULL, NULL) the old `user` may be freed; calls that start
 *   after the swap go to the new logger and are not waited for. A logger
 *   must not wait for the thread that calls set_logger. Called from inside
 *   the logger itself, it swaps the logger without waiting (it would wait
 *   for itself).
 * - The logger runs on the thread that logs: often inside an entry, which
 *   holds its group's lock, and on the library's own threads (the host
 *   backend's progress thread). It may call get_version, last_error,
 *   status_string and set_logger, and must not call entries that take a
 *   group, handle or hook: on the group whose entry is logging, on the
 *   same thread, they return INVALID_ARGUMENT at once (the lock is not
 *   recursive), and elsewhere they may wait for a lock the logging thread
 *   holds. hook_free and handle_free, called by the logger on the thread of
 *   the entry that logs (a garbage collector running in it; group_create
 *   included, which holds no group's lock while it logs), never wait for a
 *   lock: the object is gone to every other call at once, and its
 *   freeing (an unrun hook's receive abandoned, its buffer set given back)
 *   is done at once when its group's lock is free, and otherwise by the
 *   thread holding that lock (the entry that logs, when it is the same
 *   group) before it lets the lock go, or by the group's next entry before
 *   its own work, or by group_destroy. On the library's own threads the
 *   logger's frees do not wait either (the same rule). The logger's own
 *   calls leave the logging entry's last_error as it was, and what they log
 *   is not passed to the logger again.
 * - Log levels are per group: messages emitted while an entry works for a
 *   group (and by threads the library starts for it) use that group's
 *   log_level; other messages use warn. MOE_EP_LOG_LEVEL overrides both.
 *   UCX (the bootstrap, the host backend) logs through its own handlers,
 *   which are process-wide. The library adds one, the first time it
 *   calls UCX, that takes the lines UCX writes on a thread while it is
 *   inside the library (group_create, group_destroy, an entry holding a
 *   group's lock, the host backend's progress thread): an active message
 *   of an id nobody handles, which anyone reaching a worker's port can
 *   send, a peer's failure, a closing connection. It passes them to the
 *   library's logger, UCX's errors at warn (the first 16 in the process)
 *   and the rest at debug. Every other line (the engine's own UCX use,
 *   UCX's own async thread) goes on to the handlers before it, UCX's
 *   printer last. The library then stays loaded for the life of
 *   the process (moe_ep_unload does not unmap it).
 * - CUDA state (nccl backend): every entry, group_create and group_destroy
 *   included, works on the group's device and leaves the calling thread's
 *   current CUDA context as it found it, none included.
 */

/* ---- the function table ------------------------------------------------ */

typedef struct moe_ep_plugin_v1 {
  size_t struct_size; /* sizeof(moe_ep_plugin_v1_t) of the library */
  uint32_t abi_version;
  const char *name;   /* "moe_ep" */

  moe_ep_status_t (*get_version)(int *major, int *minor, int *patch);
  /* Thread-local sentence about the last failure on this thread. Valid
   * until the next call on the same thread. Never NULL. */
  const char *(*last_error)(void);
  const char *(*status_string)(moe_ep_status_t status);
  /* Route library log lines to the engine; fn NULL restores stderr.
   * Returns once the previous logger's running calls are done (see
   * "threads" above). */
  moe_ep_status_t (*set_logger)(moe_ep_logger_fn fn, void *user);

  /* `path_or_text` is a file path, or YAML text when it contains a newline
   * or a ':' and no such file exists. On success *out is a new config the
   * caller frees with config_free. */
  moe_ep_status_t (*config_from_yaml)(const char *path_or_text,
                                      moe_ep_config_t **out);
  void (*config_free)(moe_ep_config_t *config);
  /* The communication buffer bytes group_create allocates per rank for
   * this config at world_size ranks (what group_info reports). nccl LL with
   * transport auto: the size for one NVLink domain; a group that spans
   * domains uses GIN and allocates what transport gin would, and one whose
   * load/store peers are not all joined by NVLink (PCIe peer-to-peer; see
   * MOE_EP_LSA_LINK in the README) uses gin_emulated and allocates what
   * that would (the hint too, under MOE_EP_LSA_LINK=pcie). A world size
   * group_create would refuse for this config is refused here too, with
   * the same status and reason, and *bytes is left alone. */
  moe_ep_status_t (*buffer_size_hint)(const moe_ep_config_t *config,
                                      int32_t world_size, uint64_t *bytes);

  /* Collective over all ranks. On success *out is owned by the caller and
   * released with group_destroy (collective too). Refusals beside the
   * config's own rules: INVALID_ARGUMENT for a world size outside 1..1024,
   * num_experts not divisible by it or more than 1024 experts per rank, a
   * rank outside the world, a ranks_per_node that breaks its rules,
   * nccl_comm on a host group, or, with more than one rank, no job token
   * (the variable bootstrap.token_env names is unset or empty) or one of
   * fewer than 16 or more than 255 characters;
   * UNSUPPORTED for nccl high_throughput beyond 16 ranks; MISMATCH for
   * configs that differ in a key the ranks must agree on, an NCCL other
   * than the one the kernels were built against, or an adopted nccl_comm of
   * another rank or size; NCCL when libnccl.so.2 cannot be loaded.
   * Kernels (nccl backend): CUDA loads a kernel at its first launch, and
   * that load waits for every kernel running on the device; the kernels
   * are picked per call (token count, grid, index width), so a first
   * launch can come in the middle of a run, behind the engine's work or
   * behind this group's own receive of the other micro-batch. A group on a
   * communicator of its own (nccl_comm NULL), whose creation waits for the
   * device in NCCL's initialisation anyway, loads every kernel of its mode
   * here, bounded by bootstrap.timeout_ms (TIMEOUT when some work on the
   * GPU did not end by then). On the engine's communicator group_create
   * does not wait for the engine's GPU work, so each kernel loads at its
   * first launch: such an engine sets CUDA_MODULE_LOADING=EAGER or warms
   * the group up with its call shapes before serving. */
  moe_ep_status_t (*group_create)(const moe_ep_group_params_t *params,
                                  moe_ep_group_t **out);
  /* The group is gone when it returns, whatever the status. On the nccl
   * backend it waits for the group's last eager kernels, not for other
   * work on the device: up to bootstrap.timeout_ms for the kernels, then
   * each NCCL teardown step within that bound again. Past the first bound
   * it returns MOE_EP_ERR_TIMEOUT and leaves what those kernels may use
   * (window, device state, NCCL's device communicator) allocated for the
   * life of the process; an adopted nccl_comm must then outlive them. A
   * communicator the group made itself is torn down by NCCL, which waits
   * for the whole device; so does freeing the group's device memory on a
   * device without memory pools (some vGPU or MIG setups), where cudaFree
   * stands in for the stream-ordered free. No graph capture holding the
   * group's calls may still be running, and CUDA graphs holding them must
   * have finished running and must not be launched again: the group's
   * memory goes back to CUDA's pools and the library's, where the next
   * group may get it. Graphs (and executable graphs) still holding the
   * group's calls are counted and the count logged at WARN: destroying
   * them first is what keeps a later launch from writing freed memory. */
  moe_ep_status_t (*group_destroy)(moe_ep_group_t *group);
  moe_ep_status_t (*group_info)(const moe_ep_group_t *group,
                                moe_ep_group_info_t *info);
  /* OK, the status that failed the group earlier (see "Which statuses fail
   * a group" at the status enum), or an error a kernel recorded since:
   * - nccl low_latency: TIMEOUT (a wait expired), INTERNAL (a receive read
   *   a signal or list value no sender produces) or MISMATCH (ranks
   *   combined pending dispatches in different orders, or made a dispatch
   *   with different hidden, top_k or row format), all failing the group; or
   *   INVALID_ARGUMENT, leaving the group usable, for the first drop since
   *   the last report (only this entry reports it): a dispatch that met a
   *   topk_idx value outside -1..num_experts-1 and dropped that slot
   *   (reported by the rank whose topk_idx it was), or that received from
   *   one source more than max_tokens_per_rank slots of one expert (a
   *   repeat within a token) and dropped the excess (reported by the
   *   receiving rank, naming the source rank). Device-resident routing
   *   cannot be checked before the launch without a sync.
   * - nccl high_throughput: TIMEOUT; MISMATCH (ranks called set_num_sms
   *   with different values, or made a dispatch with different hidden,
   *   top_k or row format while one had MOE_EP_FLAG_WORST_CASE); INTERNAL
   *   (a combine launched with another
   *   channel count than its dispatch's layout). All fail the group. Then,
   *   since 0.5.1, INVALID_ARGUMENT once for a dispatch that met a topk_idx
   *   value outside -1..num_experts-1 and sent that slot as -1 (reported
   *   by the rank whose topk_idx it was); the group stays usable. A
   *   repeated expert is carried as given and not reported.
   * - host backend: nothing beyond the group's failure (its prepare
   *   refuses a bad topk_idx value or a repeat with INVALID_ARGUMENT). */
  moe_ep_status_t (*group_poll_error)(moe_ep_group_t *group);
  /* The SMs the group's kernels may use from the next launch on (0: the
   * backend's default). An HT combine repeats its dispatch's split of the
   * tokens, so it runs on the SMs its dispatch ran on, whatever was set in
   * between; every rank of an HT group must set the same value. An nccl
   * HT group takes at least 2 (a channel is a sender and a receiver
   * block): 1 is INVALID_ARGUMENT. */
  moe_ep_status_t (*set_num_sms)(moe_ep_group_t *group, int32_t num_sms);
  moe_ep_status_t (*max_sms_used)(const moe_ep_group_t *group,
                                  int32_t *num_sms);

  /* Routing layout for one layer call; *handle is owned by the caller
   * (handle_free). The handle refers to the engine's topk_idx tensor and to
   * the recv_count tensor its dispatch wrote: both must stay valid and
   * unchanged until the combine on this handle has completed. Each
   * topk_idx value must be -1 or an expert id, and each token's experts must
   * be distinct. The host backend's prepare refuses a break of either with
   * INVALID_ARGUMENT. On the nccl backend prepare checks neither (the ids
   * are in device memory); its kernels drop a bad id as -1, and:
   * low_latency keeps a source's first max_tokens_per_rank slots of an
   * expert in (token, k) order and drops the rest, whose share of the
   * combine is then not defined; it reports both through group_poll_error.
   * high_throughput reports a bad id the same way (since 0.5.1), and a
   * repeated expert arrives as given, unreported (recv_topk_idx names it in
   * both slots, recv_count counts both). Buffer
   * sets alternate per operation, dispatch or combine, and a later dispatch
   * on a handle's set replaces its layout (combine and handle_layout then
   * fail with a sentence saying so): combine a handle before the dispatch
   * after next when dispatches follow each other, before the next dispatch
   * when a combine comes between. That check counts dispatches as they are
   * called or captured: the replay of a CUDA graph re-runs its captured
   * dispatches on their captured buffer sets unseen by the host, so a
   * handle dispatched outside the graph is combined before any replay
   * whose captured dispatch uses its set (else its combine reads the
   * replay's layout, unreported). */
  moe_ep_status_t (*prepare)(moe_ep_group_t *group,
                             const moe_ep_prepare_params_t *params,
                             moe_ep_handle_t **handle);
  /* With MOE_EP_FLAG_DEFER_RECV, *hook receives a hook to run later;
   * otherwise *hook (if hook is non-NULL) is set to NULL. On error no hook
   * is returned and no work stays queued.
   * A dispatch or combine one rank refuses for its arguments
   * (INVALID_ARGUMENT or UNSUPPORTED before anything is sent) is an
   * operation its peers still make. On the host backend, when no hook of that rank is pending,
   * the refusal takes the operation's place: the peers' call of it fails at
   * once with INVALID_ARGUMENT naming that rank, the group stays usable and
   * every rank's next call is the next operation (a refused call is not
   * retried on one rank alone). A rank's refusal that would overwrite its
   * own earlier refusal of the same kind on the same buffer set, which a
   * peer may not have read yet, first waits, bounded by
   * timeouts.kernel_ms, until every peer that did not refuse that one too
   * has made the set's next operation after it.
   * Otherwise (the nccl backend, or a hook pending) the
   * peers wait for it until timeouts.kernel_ms and fail with TIMEOUT,
   * which fails the group: check arguments alike on every rank. */
  moe_ep_status_t (*dispatch)(moe_ep_group_t *group, moe_ep_handle_t *handle,
                              const moe_ep_dispatch_params_t *params,
                              moe_ep_hook_t **hook);
  moe_ep_status_t (*combine)(moe_ep_group_t *group, moe_ep_handle_t *handle,
                             const moe_ep_combine_params_t *params,
                             moe_ep_hook_t **hook);
  /* Finish the deferred receive on `stream` (any host thread; on the nccl
   * backend it is ordered after the send half even on another stream,
   * cudaStreamPerThread of another thread included). A stream the nccl
   * backend refuses (see prepare's) is INVALID_ARGUMENT and the hook
   * stays pending, to be run on another. A
   * hook runs once; it stays owned by the caller until hook_free. Freeing a
   * hook that never ran abandons its receive: the host backend stays
   * usable (after an abandoned combine its next send first waits, bounded,
   * for every rank to have sent that combine), and so does nccl
   * high_throughput (its receive half moves no data); nccl low_latency
   * marks the group failed (MOE_EP_ERR_MISMATCH: the ranks' signals no
   * longer agree). The handle of an abandoned dispatch is refused by
   * combine. A hook whose handle was freed before it ran runs nothing and
   * abandons its receive as hook_free would (its buffer set is free
   * again): INVALID_ARGUMENT saying so, or on nccl low_latency the
   * MISMATCH that fails the group. See "threads" above for what may run concurrently. */
  moe_ep_status_t (*hook_run)(moe_ep_hook_t *hook, void *stream);
  void (*hook_free)(moe_ep_hook_t *hook);
  void (*handle_free)(moe_ep_handle_t *handle);

  /* ---- appended in 0.3 (check with MOE_EP_HAS_ENTRY before calling) ---- */

  /* Writes an LL handle's slot layout (moe_ep_handle_layout_params_t).
   * Valid once the handle's dispatch receive has completed (its hook ran,
   * or the dispatch was not deferred) and until a later dispatch reuses its
   * buffer set (then INVALID_ARGUMENT with the sentence combine gives);
   * before that receive: INVALID_ARGUMENT; an HT handle: UNSUPPORTED (LL
   * only); a backend without it: UNSUPPORTED. */
  moe_ep_status_t (*handle_layout)(moe_ep_handle_t *handle,
                                   const moe_ep_handle_layout_params_t *params);

  /* ---- appended in 0.4 (check with MOE_EP_HAS_ENTRY before calling) ---- */

  /* *hook = the hook whose unrun receive holds the buffer set that the
   * group's next dispatch or combine uses (the hook that operation is
   * refused MOE_EP_ERR_BUSY for), or NULL when that set is free. For a
   * caller that keeps the hooks it made: after BUSY it learns whether the
   * blocker is one of its own, to run it or abandon it (hook_free). The
   * pointer is only to be compared; it may be another caller's hook. A
   * failed group still answers. */
  moe_ep_status_t (*group_busy_hook)(moe_ep_group_t *group, moe_ep_hook_t **hook);
} moe_ep_plugin_v1_t;

#define MOE_EP_PLUGIN_V1_SYMBOL "moe_ep_plugin_v1"

/* Initializers: zero everything, set struct_size. MOE_EP_INIT is a C99
 * compound literal; the functions below also work from C++. */
#define MOE_EP_INIT(type) ((type){.struct_size = sizeof(type)})

#define MOE_EP_DEFINE_INIT_(type, fn)              \
  static inline type fn(void) {                    \
    type v;                                        \
    unsigned char *b = (unsigned char *)&v;        \
    size_t i;                                      \
    for (i = 0; i < sizeof(v); i++) b[i] = 0;      \
    v.struct_size = sizeof(v);                     \
    return v;                                      \
  }
MOE_EP_DEFINE_INIT_(moe_ep_group_params_t, moe_ep_group_params_init)
MOE_EP_DEFINE_INIT_(moe_ep_group_info_t, moe_ep_group_info_init)
MOE_EP_DEFINE_INIT_(moe_ep_prepare_params_t, moe_ep_prepare_params_init)
MOE_EP_DEFINE_INIT_(moe_ep_dispatch_params_t, moe_ep_dispatch_params_init)
MOE_EP_DEFINE_INIT_(moe_ep_combine_params_t, moe_ep_combine_params_init)
MOE_EP_DEFINE_INIT_(moe_ep_handle_layout_params_t, moe_ep_handle_layout_params_init)
#undef MOE_EP_DEFINE_INIT_

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_H_ */
