/* limits.h: every hard limit of moe-ep in one place, each with its reason.
 * Plain C so runtime/ (validation) and kernels/ (launch shapes) share it. */
#ifndef MEP_LIMITS_H_
#define MEP_LIMITS_H_

/* Routing slots per token. DeepSeek-V3 uses 8, Qwen3 8, some MoEs 9 with a
 * shared expert folded in; 32 leaves room while keeping the per-token slot
 * list in registers in the LL kernels. */
#define MEP_MAX_TOP_K 32

/* Hidden is processed in 128-channel groups (one fp8 scale per group, one
 * warp-wide 16-byte vector pass per group in the kernels). */
#define MEP_HIDDEN_ALIGN 128
/* Largest hidden of any shipping MoE is 7168; 32768 leaves headroom for
 * 2x-wider models without changing any kernel (no fixed list of sizes). */
#define MEP_MAX_HIDDEN 32768

/* bf16 rows move in 16-byte vectors: hidden must be a multiple of 8 for
 * bf16 dispatch (fp8 needs MEP_HIDDEN_ALIGN for the scales). */
#define MEP_BF16_HIDDEN_ALIGN 8

/* Local experts per rank: one int32 counter and one signal per local expert
 * and source rank in the LL buffers. */
#define MEP_MAX_LOCAL_EXPERTS 1024
/* Global experts: 1024 local experts on each of 64 ranks is far beyond any
 * model; bounds the prepare kernels' per-expert count arrays. */
#define MEP_MAX_EXPERTS 65536

/* Ranks in one EP group: per-peer signal arrays are sized by this. */
#define MEP_MAX_RANKS 1024

/* LL (decode) tokens per rank: LL buffers are sized
 * num_local_experts * world * max_tokens * hidden, so this keeps them sane. */
#define MEP_MAX_TOKENS_LL 1024
/* HT (prefill) tokens per rank. */
#define MEP_MAX_TOKENS_HT 65536

/* Bounded waits (ms): bootstrap and kernel timeouts must be positive and at
 * most an hour so that a misconfiguration cannot mean "wait forever". */
#define MEP_MAX_TIMEOUT_MS 3600000

/* Bytes the runtime keeps for NCCL's device communicator (struct
 * ncclDevComm is C++ only: the C runtime holds it as bytes and the kernels
 * copy it into each launch; kernels/common/launch.cuh static_asserts that it
 * fits). */
#define MEP_DEVCOMM_BYTES 1024

/* Two buffer sets: micro-batch B may dispatch while A's receive is pending
 * (two-batch overlap). A third pending operation is refused. */
#define MEP_NUM_BUFFER_SETS 2

#endif /* MEP_LIMITS_H_ */
