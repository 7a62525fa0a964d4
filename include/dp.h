/* libdp — data-parallel training and inference with planned, fixed arenas.
 *
 * The one public header. Data flow:
 *   model spec (text or builder) -> dp_model          shapes only, no memory
 *   dp_model + dp_config         -> dp_plan           every byte and every op
 *   dp_plan                      -> dp_ctx            one allocation per arena
 *   dp_ctx + host batch          -> step / forward    no allocation, ever
 *
 * Every function returns dp_status (or a value documented otherwise). On failure
 * the text of the error (with the library's file:line) is kept: per context for
 * context calls (dp_ctx_error), and per thread for everything (dp_last_error).
 * The library never prints and never exits.
 */
#ifndef DP_H
#define DP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DP_VERSION_MAJOR 0
#define DP_VERSION_MINOR 1
#define DP_MAX_DEVICES 64
#define DP_MAX_LAYERS 256 /* layers of a model at most (dp_model_n_layers) */

typedef enum {
  DP_OK = 0,
  DP_ERR_INVALID,     /* bad argument or configuration */
  DP_ERR_PARSE,       /* malformed model spec or data file */
  DP_ERR_OVERFLOW,    /* a size does not fit in size_t */
  DP_ERR_NOMEM,       /* an arena could not be allocated */
  DP_ERR_SHAPE,       /* wrong width, or a batch larger than planned */
  DP_ERR_RANGE,       /* a label or index out of range */
  DP_ERR_NONFINITE,   /* NaN/Inf in the loss or the gradients */
  DP_ERR_IO,          /* file could not be read or written */
  DP_ERR_BACKEND,     /* a backend or transport op failed */
  DP_ERR_UNSUPPORTED, /* not available in this build or mode */
  DP_ERR_CORRUPT,     /* an arena guard was overwritten (config.guards): some op wrote
                         outside its region; the context is unusable from then on */
} dp_status;

const char *dp_status_name(dp_status s);
/* Last error text of the calling thread ("" when none). */
const char *dp_last_error(void);

/* ---- model ---------------------------------------------------------------- */

typedef enum {
  DP_LAYER_INPUT = 0,
  DP_LAYER_LINEAR,
  DP_LAYER_RELU,
  DP_LAYER_GELU, /* tanh approximation, as PyTorch's approximate='tanh' */
  DP_LAYER_TANH,
  DP_LAYER_SIGMOID,
  DP_LAYER_LAYERNORM, /* over the feature dim, affine, eps 1e-5 (or the spec's) */
  DP_LAYER_DROPOUT,
  DP_LAYER_CONV2D,    /* nn.Conv2d: NCHW, square kernel, stride, zero padding */
  DP_LAYER_MAXPOOL2D, /* nn.MaxPool2d(K, stride, padding): floor mode */
  DP_LAYER_AVGPOOL2D, /* nn.AvgPool2d(K, stride, padding): floor mode */
  DP_LAYER_FLATTEN,   /* nn.Flatten: a view (no copy, no memory) */
  DP_LAYER_BATCHNORM, /* nn.BatchNorm1d (flat) / 2d (image): eps 1e-5, momentum 0.1
                         (or the spec's), affine; running statistics as buffers
                         (config.batchnorm) */
  /* Sequences (transformers): rows of (T, D) floats, position-major. */
  DP_LAYER_EMBEDDING,    /* token ids (T) -> (T, D): nn.Embedding(V, D) of each id plus a
                            learned position embedding nn.Embedding(T, D) */
  DP_LAYER_ATTENTION,    /* causal multi-head self-attention of a fused q, k, v
                            projection (T, 3D) -> (T, D): softmax(q k^T / sqrt(D/H)) v
                            per head, each position attending to itself and earlier ones */
  DP_LAYER_RESIDUAL,     /* a residual block's start: a view of its input x */
  DP_LAYER_RESIDUAL_END, /* the block's end: x + (the block's output) */
  DP_LAYER_GELU_ERF,     /* exact gelu x Phi(x), PyTorch's nn.GELU() default
                            (approximate='none'); spec `gelu approximate none` */
  DP_LAYER_SILU,         /* nn.SiLU: x sigmoid(x) = x / (1 + e^-x) */
  DP_LAYER_LEAKY_RELU,   /* nn.LeakyReLU(negative_slope): x > 0 ? x : slope x */
  DP_LAYER_SHORTCUT,     /* a residual block's projection: ends f, and the layers from
                            here to the end are g on x (a view of it); the end gives
                            f(x) + g(x) (torchvision's downsample) */
} dp_layer_kind;

/* MSE, L1, SMOOTH_L1, HUBER, BCE_LOGITS: element-wise on float targets of the
 * output's width, the mean over every element (nn.MSELoss, nn.L1Loss,
 * nn.SmoothL1Loss(beta), nn.HuberLoss(delta): dp_model_set_loss_param;
 * nn.BCEWithLogitsLoss: binary or multi-label classification, a logit and a
 * target in [0, 1] per output). */
typedef enum {
  DP_LOSS_NONE = 0,
  DP_LOSS_MSE,
  DP_LOSS_SOFTMAX_CE,
  DP_LOSS_L1,
  DP_LOSS_SMOOTH_L1,
  DP_LOSS_HUBER,
  DP_LOSS_BCE_LOGITS, /* nn.BCEWithLogitsLoss: targets in [0, 1], one per output */
} dp_loss_kind;

typedef struct dp_model dp_model;

/* Text spec (.dpm): one layer per line, '#' starts a comment.
 *   input N | input C H W | linear N [nobias | tied] | relu |
 *   gelu [approximate tanh | approximate none] | tanh | sigmoid |
 *   silu | leaky_relu [SLOPE] |
 *   layernorm [eps E] | dropout P | conv2d OUT K [stride S] [padding P] [nobias] |
 *   maxpool2d K [stride S] [padding P] |
 *   avgpool2d K [stride S] [padding P] [exclude_pad] | flatten |
 *   batchnorm [eps E] [momentum M | momentum none] |
 *   input tokens T | embed V D | attention H [dropout P] | residual | shortcut |
 *   end |
 *   loss mse | loss l1 | loss smooth_l1 [beta B] | loss huber [delta D] |
 *   loss bce_with_logits [pos_weight P0,P1,...] |
 *   loss softmax_cross_entropy
 * An image input (C H W) is read as rows of C*H*W floats in NCHW order; conv2d
 * and the pools need an image, linear and layernorm a flat input (flatten
 * first, as PyTorch's nn.Linear would act on the last dimension only).
 * Sequences: `input tokens T` takes rows of T token ids (floats holding
 * integers 0 .. V-1) and must be followed by `embed V D`; from there a row is
 * (T, D) and linear, layernorm, the activations and dropout act on each
 * position, as PyTorch's modules on a (B, T, D) tensor do. `attention H`
 * takes (T, 3D) (q, k and v side by side, each D wide, head h at columns
 * h D/H ..) and gives (T, D). `residual` ... `end` wraps layers f: the block
 * gives x + f(x) and f must keep x's shape; blocks nest. `residual` f
 * `shortcut` g `end` gives f(x) + g(x), g on x (a projection, as torchvision's
 * downsample) giving f's output shape. The cross-entropy
 * of a sequence is over every position: targets (T) int32 per row, the mean
 * over the batch's B T tokens.
 * `gelu` alone is the tanh approximation (DP_LAYER_GELU; PyTorch's
 * approximate='tanh'), NOT PyTorch's default nn.GELU(): that one, the exact
 * x Phi(x), is `gelu approximate none` (DP_LAYER_GELU_ERF). Plain `gelu`
 * keeps its meaning so that saved specs and checkpoints keep their bits.
 * `name` is used in error messages ("name:line:col: ..."). */
dp_status dp_model_parse(const char *text, const char *name, dp_model **out);
dp_status dp_model_load(const char *path, dp_model **out);

/* Builder: dp_model_new(in) then add layers in order; shapes are inferred. */
dp_status dp_model_new(int input_width, dp_model **out);
dp_status dp_model_add_linear(dp_model *m, int out_width, int bias);
dp_status dp_model_add(dp_model *m, dp_layer_kind kind); /* relu..layernorm, flatten,
                                                           batchnorm, gelu_erf, silu,
                                                           leaky_relu (slope 0.01) */
/* nn.LeakyReLU(negative_slope): any finite slope (-0 is 0). A negative one
 * keeps the layer's input for the backward, whose sign the output's is not. */
dp_status dp_model_add_leaky_relu(dp_model *m, float negative_slope);
dp_status dp_model_add_dropout(dp_model *m, float p);
/* nn.LayerNorm(D, eps) and nn.BatchNorm1d/2d(C, eps, momentum) with other
 * than the defaults dp_model_add gives (eps 1e-5, momentum 0.1): eps in
 * (0, 1]; momentum in [0, 1], or DP_BN_MOMENTUM_NONE for PyTorch's
 * momentum=None (the running statistics are the cumulative average of every
 * training batch's: factor 1 / num_batches_tracked). The momentum is used as
 * the double of the shortest decimal that gives the float (0.01f: 0.01), as
 * PyTorch uses the Python float a script writes. */
#define DP_BN_MOMENTUM_NONE (-1.0f)
dp_status dp_model_add_layernorm(dp_model *m, float eps);
dp_status dp_model_add_batchnorm(dp_model *m, float eps, float momentum);
/* Image models: the input is (channels, height, width), NCHW. conv2d: a
 * square kernel, stride >= 1 (0: 1), zero padding >= 0, PyTorch's init
 * (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels * kernel^2).
 * Pools: DP_LAYER_MAXPOOL2D or DP_LAYER_AVGPOOL2D, stride 0: the kernel.
 * flatten: dp_model_add(m, DP_LAYER_FLATTEN). Each refuses an output that
 * would be empty, naming the sizes. */
dp_status dp_model_new_image(int channels, int height, int width, dp_model **out);
dp_status dp_model_add_conv2d(dp_model *m, int out_channels, int kernel, int stride,
                              int padding, int bias);
dp_status dp_model_add_pool2d(dp_model *m, dp_layer_kind kind, int kernel, int stride);
/* The same with PyTorch's padding (nn.MaxPool2d(K, S, P), nn.AvgPool2d(K, S, P,
 * count_include_pad=not exclude_pad)), 0 <= padding <= kernel / 2 as PyTorch
 * requires; the output is floor((n + 2 P - K) / S) + 1 (floor mode). maxpool2d
 * pads with -inf: a padded cell never wins, the gradient goes to the first
 * largest real element of the window (a NaN at once). avgpool2d sums the real
 * elements and divides by K * K, or with exclude_pad (avgpool2d only) by the
 * number of real elements in the window. Spec: `maxpool2d K [stride S]
 * [padding P]`, `avgpool2d K [stride S] [padding P] [exclude_pad]`. */
dp_status dp_model_add_pool2d_padded(dp_model *m, dp_layer_kind kind, int kernel,
                                     int stride, int padding, int exclude_pad);
/* Sequence models: the input is T token ids per row; then an embedding of a
 * vocabulary of V ids into D, which must come first. attention: heads >= 1
 * dividing D, the input (T, 3D). A residual block: begin, the layers, end
 * (the output's shape must be the begin's input shape). */
dp_status dp_model_new_tokens(int context, dp_model **out);
dp_status dp_model_add_embedding(dp_model *m, int vocab, int width);
dp_status dp_model_add_attention(dp_model *m, int heads);
/* The same with dropout p in [0, 1) on the attention probabilities in training
 * (spec: `attention H dropout P`; PyTorch's scaled_dot_product_attention
 * dropout_p), keyed as the dropout layer's masks by (seed, step, layer, global
 * row, element h T T + i T + j): the same for every split. */
dp_status dp_model_add_attention_dropout(dp_model *m, int heads, float p);
/* A linear to the vocabulary (out_width == V, from width D) without a bias whose
 * weight is the token embedding's (V, D) table, as GPT-2's tied output head (spec:
 * `linear V tied`). The table's gradient is the head's plus the embedding's, added
 * in that order; state_dict lists the table under both names. */
dp_status dp_model_add_linear_tied(dp_model *m, int out_width);
dp_status dp_model_begin_residual(dp_model *m);
dp_status dp_model_end_residual(dp_model *m);
/* Ends the open residual block's f: the layers added from here to its end
 * are g, whose input is the block's input x; the end gives f(x) + g(x), and g
 * must give f's output shape (a projection shortcut: conv2d 1x1 stride S,
 * batchnorm). At most one per block, after at least one layer of f. */
dp_status dp_model_begin_shortcut(dp_model *m);
dp_status dp_model_set_loss(dp_model *m, dp_loss_kind loss);
/* The parameter of the loss set: smooth_l1's beta (nn.SmoothL1Loss(beta)) or
 * huber's delta (nn.HuberLoss(delta)), > 0 and finite; 1 (PyTorch's default)
 * until set. Spec: `loss smooth_l1 beta B`, `loss huber delta D`. */
dp_status dp_model_set_loss_param(dp_model *m, float v);
float dp_model_loss_param(const dp_model *m); /* 0 for the other losses */
/* PyTorch's nn.CrossEntropyLoss(weight=, ignore_index=, label_smoothing=) with
 * reduction 'mean', for a model whose loss is DP_LOSS_SOFTMAX_CE (spec: `loss
 * softmax_cross_entropy label_smoothing S ignore_index I weight W0,W1,...`):
 * - ignore_index (has_ignore_index 1): a target equal to it adds no loss and no
 *   gradient, and is not counted in the mean; a label outside 0..classes-1
 *   that is not it is refused (DP_ERR_RANGE) as without the option.
 * - weights (n_weights == classes, at most DP_MAX_CLASS_WEIGHTS, finite and
 *   >= 0): target t's term is scaled by weights[t] and the mean divides by the
 *   sum of the weights of the batch's non-ignored targets.
 * - label_smoothing in [0, 1]: each target's term is (1 - S) times its
 *   weighted -log p_t plus S / classes times sum_c w_c (-log p_c).
 * The mean's denominator (the count, or weight sum, of the call's non-ignored
 * targets, over every device and process) is computed from the targets before
 * the call, exactly (per-class counts), so its bits do not depend on the
 * layout. A call whose denominator is 0 (every target ignored: PyTorch's 0/0,
 * a NaN loss) is a non-finite loss: refused (DP_ERR_NONFINITE) or, under
 * DP_NONFINITE_SKIP, skipped and counted, with nothing applied. With
 * config.accumulate, each call's mean is over its own targets, divided by
 * the accumulation (PyTorch's `(loss / accumulate).backward()` loop).
 * All zero (label_smoothing 0, no ignore_index, no weights) is the plain loss,
 * its bits unchanged. The model copies the weights. */
#define DP_MAX_CLASS_WEIGHTS 1024
typedef struct {
  float label_smoothing; /* [0, 1] */
  int has_ignore_index;  /* 1: ignore_index is in effect */
  int32_t ignore_index;  /* PyTorch's default is -100 */
  int n_weights;         /* 0: no class weights; else the model's classes */
  const float *weights;  /* (n_weights); read back: the model's own copy */
} dp_ce_options;
dp_status dp_model_set_ce_options(dp_model *m, const dp_ce_options *o);
/* The options in effect (all zero for none, or for another loss). */
dp_status dp_model_ce_options(const dp_model *m, dp_ce_options *out);
/* PyTorch's nn.BCEWithLogitsLoss(pos_weight=) with reduction 'mean', for a
 * model whose loss is DP_LOSS_BCE_LOGITS (spec: `loss bce_with_logits
 * pos_weight P0,P1,...`): one weight per output (n_pos_weights == the output
 * width, at most DP_MAX_CLASS_WEIGHTS, finite and >= 0) scales the positive
 * term of its column: with lw = (p - 1) t + 1 the term is (1 - t) x + lw
 * (log(1 + e^-x)), its gradient ((p t + 1 - t) sigmoid(x) - p t) / the count;
 * the mean is over every element as without it. n_pos_weights 0 (none) is the
 * plain loss, its bits unchanged. The model copies the weights. */
typedef struct {
  int n_pos_weights;        /* 0: none; else the model's output width */
  const float *pos_weights; /* (n_pos_weights); read back: the model's own copy */
} dp_bce_options;
dp_status dp_model_set_bce_options(dp_model *m, const dp_bce_options *o);
/* The options in effect (all zero for none, or for another loss). */
dp_status dp_model_bce_options(const dp_model *m, dp_bce_options *out);
void dp_model_free(dp_model *m);

int dp_model_input_width(const dp_model *m);
int dp_model_output_width(const dp_model *m);
/* Positions per row of the output: T for a sequence, 1 otherwise. */
int dp_model_positions(const dp_model *m);
/* Elements per row of the targets dp_train_step takes: mse, l1, smooth_l1,
 * huber: the output width (floats); softmax cross-entropy: one int32 label per
 * position. */
int dp_model_target_width(const dp_model *m);
int dp_model_n_layers(const dp_model *m); /* layers after `input` */
dp_layer_kind dp_model_layer_kind(const dp_model *m, int i);
dp_loss_kind dp_model_loss(const dp_model *m);
/* Total parameter count, in PyTorch state_dict order:
 * for each linear: weight (out, in) row-major, then bias (out);
 * for each layernorm: weight (n), bias (n). */
size_t dp_model_n_params(const dp_model *m);
/* Writes the spec text form into buf (NUL-terminated); returns needed length. */
size_t dp_model_format(const dp_model *m, char *buf, size_t cap);

/* ---- configuration and plan ------------------------------------------------ */

typedef enum {
  DP_SPLIT_CHUNK = 0, /* torch.chunk: chunk = ceil(B/N), last may be short, fewer
                         devices may be used */
  DP_SPLIT_BALANCED,  /* torch.tensor_split: first B%N devices get one more row */
  DP_SPLIT_MEMORY,    /* device 0 gets fewer rows so that the largest arena is as
                         small as it can be (classic mode puts the gathered
                         outputs on device 0); the others split the rest
                         balanced */
} dp_split;

/* classic: nn.DataParallel (loss and optimizer on device 0, parameters
 * broadcast). allreduce: DDP-like in one process (targets scattered, each
 * device computes its own loss terms, gradients all-reduced, every replica
 * applies the same update). */
typedef enum { DP_MODE_CLASSIC = 0, DP_MODE_ALLREDUCE } dp_mode;
/* DP_OPT_ADAM: torch.optim.Adam, L2 weight decay added to the gradient before
 * the moments (coupled), unlike DP_OPT_ADAMW's decoupled decay; appended, so the
 * other values keep their numbers (checkpoints store them). */
typedef enum { DP_OPT_SGD = 0, DP_OPT_MOMENTUM, DP_OPT_ADAMW, DP_OPT_ADAM } dp_optimizer;
/* A backend, by its kind: the index of its name in the registry. The cpu
 * backend is built in; others register from their own library (the cuda
 * backend: dp_cuda_register) under a name, and "cpu" and "cuda" keep these
 * two kinds whether registered or not. */
typedef enum { DP_BACKEND_CPU = 0, DP_BACKEND_CUDA } dp_backend;
#define DP_BACKEND_OPTIONS_CAP 128         /* dp_config.backend_options, with its NUL */
const char *dp_backend_name(dp_backend b); /* "cpu", "cuda", ...; "?" when unknown */
/* Kinds [0, dp_backend_count()) have names; dp_backend_available says whether
 * a backend is registered under one (a plan can name it). */
int dp_backend_count(void);
int dp_backend_available(dp_backend b);
/* The kind of the registered backend `name`; DP_ERR_UNSUPPORTED when none is. */
dp_status dp_backend_find(const char *name, dp_backend *kind);
/* What a registered backend reports of itself, so that a program can act on
 * any backend without naming one (the `dp` command names none): bits of
 * DP_BACKEND_CAP_*, 0 when b is not registered.
 *   DEVICES     its devices are the machine's own (the cuda backend: GPUs):
 *               config.device_ids pick among them (replicas may share one), a
 *               context needs one to be visible, dp_backend_device_count
 *               counts them. Without it the devices are virtual (the cpu
 *               backend: a thread each), as many as asked, and device_ids
 *               only label them.
 *   GEMM_BENCH  dp_bench_sgemm times its GEMM. */
#define DP_BACKEND_CAP_DEVICES 1u
#define DP_BACKEND_CAP_GEMM_BENCH 2u
unsigned dp_backend_caps(dp_backend b);
/* The registered backend of lowest kind that has every cap in `caps`;
 * DP_ERR_UNSUPPORTED when none has (the message lists the registered ones). */
dp_status dp_backend_find_caps(unsigned caps, dp_backend *kind);
/* The devices of backend b (DP_BACKEND_CAP_DEVICES): how many are visible, 0
 * with the reason in dp_last_error() when none is, b is not registered or has
 * no devices of its own; the name (NUL-terminated, cut to cap) and memory of
 * device dev, any output may be NULL (reading the free memory may create the
 * device's context), DP_ERR_UNSUPPORTED when b is not registered or has no
 * device query. dp_cuda_device_count and dp_cuda_device_info are these for
 * DP_BACKEND_CUDA. */
int dp_backend_device_count(dp_backend b);
dp_status dp_backend_device_info(dp_backend b, int dev, char *name, size_t cap,
                                 size_t *total_mem, size_t *free_mem);

/* How the CUDA backend moves data between replicas on distinct GPUs. AUTO:
 * NCCL send/recv when the build has NCCL, every replica has a GPU of its own
 * and cuda_graph is off (a graph across GPUs with NCCL inside can deadlock:
 * cuda_graph with NCCL is refused), else CUDA copies (cudaMemcpyPeerAsync; same-GPU
 * replicas always use device-to-device copies). Either way the reductions are the
 * schedule's own canonical tree (our add kernel), so the bits do not depend on it. */
typedef enum { DP_TRANSPORT_AUTO = 0, DP_TRANSPORT_COPY, DP_TRANSPORT_NCCL } dp_transport;

/* What a training step does when its loss or a gradient is NaN or infinite.
 * Either way nothing is applied: parameters, optimizer state and the step
 * counter stay as they were. ERROR: the step returns DP_ERR_NONFINITE.
 * SKIP: the step returns DP_OK with *loss = NaN, and dp_ctx_skipped_steps
 * counts it (dp_ctx_error says why it was skipped). */
typedef enum { DP_NONFINITE_ERROR = 0, DP_NONFINITE_SKIP } dp_nonfinite_policy;

/* Batch normalisation under data parallelism. PER_REPLICA: each micro-batch
 * is normalised with its own statistics (with the default micro-batch, one per
 * device: nn.DataParallel's behaviour), and the running statistics follow
 * micro-batch 0 (device 0's replica, as DataParallel keeps them). SYNC: the
 * whole batch's statistics (SyncBatchNorm), reduced in the canonical tree. */
typedef enum { DP_BN_PER_REPLICA = 0, DP_BN_SYNC } dp_bn_mode;

/* The arithmetic of a training step or forward (docs/PRECISION.md).
 * FP32: every tensor and every operation in fp32 (the default).
 * BF16: mixed precision as torch.autocast(dtype=torch.bfloat16) on the CPU:
 * the activations between layers and their gradients are stored as bf16 (half
 * the activation bytes); linear layers multiply bf16 operands (the weights
 * rounded from the fp32 masters as they are packed) with fp32 accumulation in
 * the canonical order of the AVX512-BF16 dot product, whose bits every CPU
 * tier reproduces; the other layers compute in fp32 from bf16 inputs and round
 * their outputs to bf16 (round to nearest even); the model's output, the loss
 * and its gradient are fp32; the weight gradients are rounded to bf16 and
 * reduced in fp32 along the canonical tree (batchnorm's stay fp32, its
 * statistics fp32 over the bf16 values, as autocast's batch_norm); the master
 * weights and the optimizer state stay fp32. The same bits for every device
 * count, mode and process layout under the determinism conditions. cpu and
 * cuda backends. */
typedef enum { DP_PRECISION_FP32 = 0, DP_PRECISION_BF16 } dp_precision;
/* "fp32", "bf16"; "?" when unknown. dp_precision_parse takes those names and
 * refuses anything else (DP_ERR_INVALID naming the options). */
const char *dp_precision_name(dp_precision p);
dp_status dp_precision_parse(const char *name, dp_precision *out);

typedef struct {
  int batch;     /* largest batch a step may take (rows) */
  int n_devices; /* logical devices (replicas) of the whole job */
  /* Processes (MPI ranks) the job runs as, each driving n_devices / ranks of
   * the devices: global device g belongs to rank g / (n_devices / ranks) as its
   * local device g % (n_devices / ranks). 0 or 1: one process (the default).
   * The plan is the whole job's, identical on every rank; each rank's context
   * (dp_ctx_create_mpi, dp_mpi.h) holds only its own devices' arenas, and the
   * results are bit-identical for every layout of the same n_devices. */
  int ranks;
  int device_ids[DP_MAX_DEVICES]; /* physical GPU per replica (cuda) */
  dp_split split;
  int micro_batch; /* rows per micro-batch; 0 = the per-device chunk */
  dp_mode mode;
  int shard_optimizer; /* allreduce: each device keeps and updates only its
                          shard of the optimizer state (ZeRO-1 style) */
  dp_optimizer optimizer;
  int inference; /* plan forward only: no grads, no optimizer state */
  dp_backend backend;
  /* Hyper-parameters: PyTorch's meanings, plain values (no sentinels). In a
   * training plan every one must be finite; the planner refuses a value out
   * of range or one that contradicts the optimizer, naming it (an inference
   * plan ignores them). dp_config_default gives
   * torch.optim.SGD's defaults; dp_config_set_optimizer gives the defaults of
   * the optimizer it selects (AdamW: weight_decay 0.01). */
  float lr; /* > 0; default 0.01 */
  /* torch.optim.SGD(lr, momentum=0, dampening=0, weight_decay=0, nesterov=False).
   * DP_OPT_SGD with momentum > 0 keeps a momentum buffer (the plan reports it
   * as DP_OPT_MOMENTUM, which is SGD with momentum > 0 by name). AdamW refuses
   * momentum, dampening or nesterov. */
  float momentum;          /* [0, 1); default 0 */
  float dampening;         /* [0, 1]; default 0 (needs momentum > 0 when nonzero) */
  int nesterov;            /* 0 or 1; needs momentum > 0 and dampening 0 */
  float weight_decay;      /* >= 0. SGD, Adam: L2 added to the gradient (PyTorch default 0);
                              AdamW: decoupled (PyTorch default 0.01) */
  float beta1, beta2, eps; /* Adam, AdamW: 0 <= beta < 1, eps > 0; defaults 0.9, 0.999,
                              1e-8 */
  uint64_t seed;           /* parameter init and dropout */
  /* torch.nn.utils.clip_grad_norm_(parameters, max_norm): before every
   * update, the L2 norm of all the gradients together is computed and, when
   * above max_norm, every gradient is scaled by max_norm / (norm + 1e-6). The
   * norm is summed exactly (bins per exponent, in integers), so it is the same
   * bits for every device count, mode and layout. dp_ctx_grad_norm gives the
   * norm of the last step. Finite, >= 0; 0: off (default). cpu and cuda
   * backends. Not with clip_grad_value (PyTorch users call one or the other:
   * refused). */
  float clip_grad_norm;
  /* Gradient accumulation: the parameters are updated every `accumulate`
   * dp_train_step calls, with the gradient of the mean loss over all their
   * rows (each call's loss gradient is scaled by 1 / (accumulate * rows), as
   * PyTorch's loss / accumulation_steps before backward). With calls of equal
   * rows, the update is bit-identical to one step of the concatenated batch on
   * a context planned for accumulate * batch (the determinism conditions of
   * docs/DETERMINISM.md; dropout is keyed by the row in the concatenation);
   * not with the cross-entropy options (dp_ce_options), whose mean is each
   * call's own.
   * The partial sums live in the optimizer_state region (log2(accumulate)
   * gradient copies per device: dp plan shows them). A power of two up to
   * 65536, with batch * accumulate at most INT_MAX rows (DP_ERR_OVERFLOW
   * otherwise); 0 or 1: every call updates (default). cpu and cuda backends. */
  int accumulate;
  /* Activation recompute (gradient checkpointing), training only: K >= 1 cuts
   * the layers into segments of K (a layer that keeps no buffer of its own,
   * a view or a linear whose relu the backend fuses, extends its segment to
   * the next one). The forward keeps only the outputs the backward of another
   * segment reads (each segment's last output, a residual block's input read
   * past a cut, a sync batchnorm's input and output) for all of a device's
   * rows; a segment's other outputs live one micro-batch at a time. Before a
   * segment's backward of each micro-batch, the backward re-runs the
   * segment's forward ops for that micro-batch from the kept outputs into
   * planned recompute buffers. Bit-identical to the run without it (the same
   * ops, dropout masks keyed as in the forward, batchnorm's statistics of the
   * same rows, running statistics updated once); costs about one forward more
   * per step. 0: off (default); 0 .. 256. dp plan shows the activation bytes
   * with and without it. */
  int recompute;
  /* DP_PRECISION_FP32 (default) or DP_PRECISION_BF16 (mixed precision: see
   * dp_precision). Training and inference. */
  dp_precision precision;
  /* The precision of the gradient reduction (docs/PRECISION.md, "Gradient
   * reduction"): DP_PRECISION_FP32 (default) sums fp32 gradients;
   * DP_PRECISION_BF16 rounds each micro-batch's gradient to bf16 and every sum
   * of the canonical tree to bf16 (computed in fp32, round to nearest even), so
   * that what crosses a process or GPU boundary is half the bytes; the same
   * bits for every device count, mode and process layout, as fp32's. Either
   * precision; not with fast_collectives (NCCL's own order). Training only. */
  dp_precision reduce_precision;
  /* Batchnorm layers in training: DP_BN_PER_REPLICA (default) normalises each
   * micro-batch with its own statistics (nn.DataParallel with one micro-batch
   * per device); DP_BN_SYNC with the whole batch's (SyncBatchNorm), reduced in
   * the canonical tree: the same bits for every device count and layout
   * under the determinism conditions. Both backends. */
  dp_bn_mode batchnorm;
  dp_nonfinite_policy on_nonfinite; /* default DP_NONFINITE_ERROR */
  /* Arena guards (default 0; a run-time switch in every build). When set, the
   * planner puts a guard of one alignment unit (64 bytes on the cpu backend,
   * 256 on cuda) before the first region and after every region (empty ones
   * too), so device totals grow (region sizes do not: they count content);
   * the guard after a region runs from its content end to the next region,
   * alignment padding included. The context fills guards with a canary and
   * checks them before any step commits its update and after every step and
   * forward; a damaged guard fails the call with DP_ERR_CORRUPT naming the
   * device and the region the write ran out of. Off, the layout is exactly
   * the unguarded one. The host staging arena has no guards. */
  int guards;
  /* Longest a step may wait for a device or a peer, in milliseconds, before it
   * fails with DP_ERR_BACKEND (and leaves the context unusable) instead of
   * hanging: a stalled kernel, an NCCL transfer whose other side never comes,
   * an MPI rank that stopped answering. 0: the default, 60000. */
  int timeout_ms;
  /* The backend's own options: "name=value" items separated by commas or
   * spaces, e.g. "graph=1" or "transport=nccl,tf32=1" for the cuda backend.
   * Each backend lists its own (dp_backend_option_info) and checks them; the
   * plan keeps them (dp_plan_backend_options) and its hash covers them. An
   * option of no such name, or a value the backend does not list, is refused
   * at plan time. Empty: every option at its default. */
  char backend_options[DP_BACKEND_OPTIONS_CAP];
  /* ---- deprecated: the cuda backend's options as fields (a cpu plan with any
   * of them set is refused). Use backend_options ("graph", "tf32",
   * "transport", "fast_collectives"); a field and an option that disagree are
   * refused. ---- */
  /* Capture a step once, after one plain warm-up step of the same shape, as a
   * CUDA graph and replay it (cudaGraphLaunch) from then on: one launch per
   * step instead of one per op. Bit-identical to plain execution. Only full
   * batches (rows == batch) are captured; smaller ones run plain. */
  int cuda_graph;
  /* Let cuBLAS use TF32 tensor cores for the FP32 GEMMs: faster, ~1e-3
   * relative error, so results no longer match the cpu backend closely
   * (still bit-identical run to run and across replica counts). */
  int tf32;
  dp_transport transport; /* default DP_TRANSPORT_AUTO */
  /* Allreduce mode across distinct GPUs: sum the gradients with one
   * ncclAllReduce instead of the library's canonical tree. Faster on many
   * GPUs, but NCCL picks the summation order from the topology: results are
   * bit-identical run to run only on a fixed topology and device count, and
   * differ from other device counts and from the cpu backend in the last
   * bits. Needs allreduce mode, no sharded optimizer, a GPU per replica and
   * a build with NCCL. */
  int fast_collectives;
  /* ---- appended after the fields above, which keep their offsets ---- */
  /* torch.nn.utils.clip_grad_value_(parameters, clip_value): before every
   * update (after the reduction, and after accumulate's sum), every gradient
   * is clamped to [-clip_grad_value, clip_grad_value], in place (dp_get_grads
   * shows the clamped values). Elementwise, so the same bits for every device
   * count, mode and layout. As PyTorch's clamp, a NaN gradient stays NaN (the
   * step is then refused by on_nonfinite's policy) and an infinite one becomes
   * +-clip_grad_value. Finite, >= 0; 0: off (default). Not with clip_grad_norm
   * (refused). cpu and cuda backends. */
  float clip_grad_value;
  /* torch.optim.Adam / AdamW(amsgrad=True): a third state vector, v_hat, the
   * running maximum of the second moment v (v_hat = max(v_hat, v) each step),
   * and the step's denominator sqrt(v_hat) / sqrt(1 - beta2^t) + eps. 0 or 1
   * (default 0, PyTorch's); only with DP_OPT_ADAM and DP_OPT_ADAMW (refused
   * with another optimizer; an inference plan ignores it). The plan counts
   * the third vector in the optimizer state, checkpoints save it, and a
   * checkpoint loads only into a context of the same setting. cpu and cuda
   * backends, every mode, sharded optimizer and precision. */
  int amsgrad;
} dp_config;

/* What a backend's options can be: option i (0, 1, ...) of backend b, its
 * name, the words it takes ("0|1", "auto|copy|nccl"; the first is the
 * default) and a line of help. DP_ERR_RANGE past its last option,
 * DP_ERR_UNSUPPORTED when b is not registered. */
dp_status dp_backend_option_info(dp_backend b, int i, const char **name,
                                 const char **values, const char **help);

/* c's backend options (and the deprecated fields above) checked against its
 * backend's table, as planning checks them, without a model: a program (the dp
 * tool) refuses a wrong one before it reads any data. DP_ERR_INVALID naming
 * the option, DP_ERR_UNSUPPORTED when c->backend is not registered. */
dp_status dp_backend_options_check(const dp_config *c);

/* Fills defaults: batch 0 (must be set), 1 device, chunk split, classic,
 * torch.optim.SGD (lr 0.01, momentum 0, dampening 0, nesterov 0,
 * weight_decay 0), training, cpu backend, device_ids[i] = i, non-finite steps are errors,
 * guards off in every build (DP_DEBUG too: a program that wants them in
 * checked builds sets guards = 1 under #ifdef DP_DEBUG). */
void dp_config_default(dp_config *c);
/* Selects an optimizer with PyTorch's defaults for it, leaving lr and every
 * non-optimizer field alone: DP_OPT_SGD: momentum 0, dampening 0, nesterov 0,
 * weight_decay 0; DP_OPT_MOMENTUM: the same with momentum 0.9; DP_OPT_ADAMW:
 * betas (0.9, 0.999), eps 1e-8, weight_decay 0.01, momentum 0; DP_OPT_ADAM: the
 * same with weight_decay 0. amsgrad 0 for every one (PyTorch's default). */
void dp_config_set_optimizer(dp_config *c, dp_optimizer o);

typedef struct dp_plan dp_plan;

dp_status dp_plan_create(const dp_model *m, const dp_config *c, dp_plan **out);
void dp_plan_free(dp_plan *p);

/* The largest batch B in 1..max_batch whose plan fits `budget` bytes on every
 * device and in the host staging arena; 0 when none does. Exact, and not a
 * bisection over 1..max_batch: a plan can shrink as the batch grows (in
 * allreduce mode a larger batch may use more devices, so each holds a smaller
 * optimizer shard and receive buffer), so batches below B may fail while B
 * fits. Every batch above B, up to max_batch, fails. A context planned for B
 * takes any batch of 1..B rows. */
dp_status dp_plan_max_batch(const dp_model *m, const dp_config *c, size_t budget,
                            int max_batch, int *out_batch);

/* ---- fitting a budget ----
 * dp_plan_fit searches the configurations that `allow` opens (starting from c:
 * every other field stays c's) for the ones whose plan fits `budget` bytes on
 * every device and in the host staging arena, and ranks them by a cost model's
 * step time. Exact like every plan: each candidate is planned in full. */
enum {
  DP_FIT_MODE = 1 << 0,        /* classic or allreduce */
  DP_FIT_SHARD = 1 << 1,       /* allreduce with a sharded optimizer */
  DP_FIT_SPLIT = 1 << 2,       /* chunk, balanced or memory */
  DP_FIT_MICRO_BATCH = 1 << 3, /* powers of two below a device's rows: a different
                                  canonical tree, so other bits than c's micro-batch */
  DP_FIT_RECOMPUTE = 1 << 4,   /* activation recompute every K layers (the same bits) */
  DP_FIT_PRECISION = 1 << 5,   /* bf16 mixed precision (other bits than fp32) */
  DP_FIT_BACKEND = 1 << 6,     /* the backend's options that keep the results and
                                  change memory or speed, where c's backend_options
                                  does not set them (the cpu backend's params=shared) */
  DP_FIT_ALL = (1 << 7) - 1
};
/* The cost model, per device (docs/PLANNER.md: what `dp bench` measures for each):
 * a GEMM of r rows runs at gflops * r / (r + half_rows) (bf16_gflops in bf16);
 * every other byte an op streams moves at mem_gbs; each op costs op_us more; the
 * step lasts as long as the slowest device. */
typedef struct {
  double gflops;    /* GEMM GFLOP/s at large row counts */
  double half_rows; /* the rows at which a GEMM runs at half of that */
  double mem_gbs;   /* GB/s of copies, adds, updates and elementwise layers */
  double op_us;     /* microseconds per op of the schedule */
  double bf16_gflops; /* bf16 GEMM GFLOP/s at large row counts (precision bf16);
                         0: as gflops */
} dp_fit_costs;
void dp_fit_costs_default(dp_fit_costs *k);
typedef struct {
  dp_config config; /* c with the fitted fields (mode, shard_optimizer, split, micro_batch,
                       recompute, precision, backend_options) */
  size_t bytes;  /* its largest arena, device or host staging */
  double est_ms; /* the cost model's step time */
} dp_fit;
/* Writes the (up to) cap fitting candidates with the shortest estimated step,
 * fastest first, to out and their count to *n. None fits: DP_ERR_RANGE, whose
 * message names the smallest configuration found and by how many bytes it
 * misses; out[0] (cap > 0) is that configuration and *n is 0. costs NULL: the
 * defaults (dp_fit_costs_default). */
dp_status dp_plan_fit(const dp_model *m, const dp_config *c, size_t budget, unsigned allow,
                      const dp_fit_costs *costs, dp_fit *out, int cap, int *n);

/* Arena regions, in arena order. Every device has all of them (size 0 when
 * unused). A region's size counts its content; alignment padding shows in the
 * offsets and in the device total. */
typedef enum {
  DP_REGION_PARAMS = 0,       /* (n_params) fp32, state_dict order */
  DP_REGION_GRADS,            /* (n_params) reduced grads (dev 0) / local grads */
  DP_REGION_GRAD_PARTIALS,    /* (levels, n_params) partial sums of the grad tree */
  DP_REGION_OPT_STATE,        /* momentum buffer, or AdamW (m, v) */
  DP_REGION_INPUTS,           /* (rows, in) this device's input chunk */
  DP_REGION_TARGETS,          /* (batch, out) fp32 or (batch) int32, loss device */
  DP_REGION_ACTIVATIONS,      /* liveness-planned intermediate buffers */
  DP_REGION_OUTPUTS,          /* (rows, out) this device's output chunk */
  DP_REGION_OUTPUT_GRADS,     /* (rows, out) scattered d(loss)/d(output) */
  DP_REGION_GATHERED_OUTPUTS, /* (batch, out) on the output device */
  DP_REGION_GATHERED_GRADS,   /* (batch, out) on the output device */
  DP_REGION_LOSS,             /* (micro-batches) per-micro-batch loss sums */
  DP_REGION_COMM,             /* (n_params) receive buffer for reductions */
  DP_REGION_WORKSPACE,        /* backend scratch */
  DP_REGION_COUNT
} dp_region;

const char *dp_region_name(dp_region r);

typedef struct {
  size_t offset, size, align;
} dp_region_info;

int dp_plan_n_devices(const dp_plan *p); /* devices with rows (<= n_devices) */
int dp_plan_device_rows(const dp_plan *p, int dev);
int dp_plan_device_micro_batches(const dp_plan *p, int dev);
/* Whether a training step (an inference plan: a forward) of `rows` rows can
 * run on p's cut (before any data): DP_ERR_RANGE outside 1..batch, DP_ERR_SHAPE
 * when a training step's batchnorm would get a micro-batch (sync: a batch) of
 * one value per channel. A forward (eval mode) takes any 1..batch rows. */
dp_status dp_plan_check_rows(const dp_plan *p, int rows);
size_t dp_plan_device_bytes(const dp_plan *p, int dev); /* arena total */
/* What device dev's intermediate buffers (layer outputs, their gradients,
 * saved statistics; a flatten has none) would take if each had memory of its
 * own, aligned: the activations region holds them in less where lifetimes do
 * not overlap (0 for a bad device). */
size_t dp_plan_activation_bytes_unshared(const dp_plan *p, int dev);
dp_region_info dp_plan_region(const dp_plan *p, int dev, dp_region r);
size_t dp_plan_host_bytes(const dp_plan *p); /* staging arena (pinned, cuda) */
/* Alignment of every region and of the arenas dp_ctx_create_static takes:
 * 64 bytes on the cpu backend, 256 on cuda. */
size_t dp_plan_alignment(const dp_plan *p);
const dp_config *dp_plan_config(const dp_plan *p);
const dp_model *dp_plan_model(const dp_plan *p);

/* ---- the job's processes (config.ranks; docs/DISTRIBUTED.md) ---- */
int dp_plan_ranks(const dp_plan *p);         /* 1 for a one-process plan */
int dp_plan_local_devices(const dp_plan *p); /* devices per rank: n_devices / ranks */
int dp_plan_device_rank(const dp_plan *p, int dev); /* the rank that holds dev; -1 */
/* The rows of a batch of `rows` (1..batch) that rank `rank`'s devices take:
 * global rows [*row0, *row0 + *n) (*n may be 0: the rank's devices got no
 * rows). On that rank, dp_train_step and dp_forward take `rows` (the whole
 * batch, the same on every rank) with x, targets and outputs holding only
 * these rows. DP_ERR_INVALID for a rank out of range (or a NULL argument),
 * DP_ERR_SHAPE for rows outside 1..batch. */
dp_status dp_plan_rank_rows(const dp_plan *p, int rows, int rank, int *row0, int *n);
/* A hash of everything the ranks of a job must share: the model, the config
 * (ranks included), the schedule and the build. dp_ctx_create_mpi compares
 * the ranks' hashes and refuses a job whose ranks differ, naming them. */
uint64_t dp_plan_hash(const dp_plan *p);
/* The plan's backend options, every one with its value (defaults included),
 * as "name=value" items separated by spaces ("" for a backend without
 * options); truncated to cap - 1 bytes. DP_ERR_INVALID for a NULL argument. */
dp_status dp_plan_backend_options(const dp_plan *p, char *buf, size_t cap);
/* Arena bytes the process of rank `rank` holds: the sum over its devices. */
size_t dp_plan_rank_bytes(const dp_plan *p, int rank);

/* The static schedule. Ops run in stage order; ops of one stage on different
 * devices run in parallel; within a device, in list order. */
typedef enum {
  DP_PHASE_BROADCAST = 0, /* refresh replicas' params from device 0 */
  DP_PHASE_SCATTER,       /* host inputs -> device chunks */
  DP_PHASE_FORWARD,
  DP_PHASE_GATHER, /* output chunks -> device 0 (or host) */
  DP_PHASE_LOSS,
  DP_PHASE_SCATTER_GRADS, /* d(loss)/d(outputs) -> device chunks */
  DP_PHASE_BACKWARD,
  DP_PHASE_REDUCE, /* gradients -> device 0, canonical tree */
  DP_PHASE_OPTIMIZER,
  DP_PHASE_COUNT
} dp_phase;

typedef enum {
  DP_OP_COPY = 0,   /* transport: bytes from (src dev, region, offset) to dst */
  DP_OP_FORWARD,    /* layer forward on one micro-batch */
  DP_OP_BACKWARD,   /* layer backward on one micro-batch, grads into a slot */
  DP_OP_GRAD_ADD,   /* grads slot += slot, or grads += comm */
  DP_OP_ZERO,       /* dst = 0 (a device with no rows adds nothing to the allreduce) */
  DP_OP_LOSS,       /* per-micro-batch loss sums and d(loss)/d(outputs) for the
                       device's rows (classic: device 0, all rows) */
  DP_OP_LOSS_SUM,   /* device 0: the loss from all micro-batch sums */
  DP_OP_GRAD_CHECK, /* refuse the step if a gradient (of the shard) is not finite */
  DP_OP_OPTIMIZER,  /* update params [dst_offset, +bytes) (a shard, or all) */
  DP_OP_ALLREDUCE,  /* config.fast_collectives: every device's grads summed in place by
                       the transport's own collective (ncclAllReduce), one op per device */
  DP_OP_GRAD_NORM,  /* config.clip_grad_norm: exact sums of squares of grads [src_offset,
                       +bytes) by exponent, into a slot of the comm region */
  DP_OP_GRAD_CLIP,  /* the norm from n_mb slots; grads [dst_offset, +bytes) scaled when
                       it is above clip_grad_norm */
  DP_OP_GRAD_ACCUM, /* config.accumulate: grads [dst_offset, +bytes) += the partial sums
                       of the earlier calls (optimizer_state from src_offset) */
  DP_OP_GRAD_STASH, /* config.accumulate, a call that does not update: its partial sum
                       into the optimizer_state slots (the commit phase) */
  DP_OP_BN_UPDATE,  /* batchnorm layer `layer`: device 0's running statistics from
                       micro-batch 0's (the commit phase) */
  /* config.batchnorm = DP_BN_SYNC: whole-batch statistics, reduced in the
   * canonical tree in the middle of the forward and of the backward */
  DP_OP_BN_STATS,     /* micro-batch's count, mean and sum of squared deviations */
  DP_OP_BN_MERGE,     /* statistics slot dst_offset merged with slot src_offset */
  DP_OP_BN_FINAL,     /* the whole batch's mean, 1/std and unbiased variance from the
                         tree's root (bytes: the result's, at dst_offset) */
  DP_OP_BN_BWD_STATS, /* micro-batch's sums of dy and dy * x-hat (its weight and bias
                         gradients, into the grads slot) */
  DP_OP_COPY_ADD,     /* transport: dst += src, float by float, between two devices of
                         one process whose transport adds in place (the cpu backend's):
                         a reduction step's copy and add in one pass, no comm buffer */
  DP_OP_GRAD_PACK,    /* config.reduce_precision bf16: grads [src_offset, +bytes) rounded
                         to bf16 into the comm region at dst_offset (bytes / 2) */
  DP_OP_GRAD_UNPACK,  /* the reverse: bf16 values at src_offset (bytes / 2) widened into
                         grads [dst_offset, +bytes) */
  DP_OP_GRAD_CLAMP,   /* config.clip_grad_value: grads [dst_offset, +bytes) clamped to
                         [-clip_grad_value, clip_grad_value] */
} dp_op_kind;

/* Device id of the caller's memory. A host endpoint's region says which
 * buffer: DP_REGION_INPUTS (x), DP_REGION_TARGETS, DP_REGION_OUTPUTS (y). */
#define DP_HOST (-1)

/* dp_op.flags (config.reduce_precision bf16: docs/PRECISION.md) */
enum {
  DP_OPF_ROUND_BF16 = 1u << 0, /* GRAD_ADD, COPY_ADD, GRAD_ACCUM: the sums rounded to bf16;
                                  BACKWARD, BN_BWD_STATS: the gradients they write */
  DP_OPF_SRC_BF16 = 1u << 1,   /* GRAD_ADD: src holds bytes / 2 of bf16 values */
};

typedef struct {
  uint8_t phase, kind;
  uint8_t flags;       /* DP_OPF_* */
  int16_t device;      /* device that executes the op */
  int16_t layer;       /* -1 when not a layer op */
  int32_t micro_batch; /* first global micro-batch index, -1 when none */
  int32_t n_mb;        /* micro-batches covered (LOSS, LOSS_SUM) */
  int32_t stage;
  int16_t src_dev, dst_dev;       /* COPY: endpoints (DP_HOST = caller memory) */
  uint8_t src_region, dst_region; /* COPY, GRAD_ADD (dst += src), BACKWARD (grads) */
  size_t src_offset, dst_offset;
  size_t bytes;       /* bytes moved (COPY) or touched */
  int32_t row0, rows; /* rows the op covers */
} dp_op;

int dp_plan_n_ops(const dp_plan *p);
const dp_op *dp_plan_ops(const dp_plan *p);
const char *dp_phase_name(dp_phase ph);
const char *dp_op_kind_name(dp_op_kind k);

/* ---- context --------------------------------------------------------------- */

typedef struct dp_ctx dp_ctx;

/* Allocates one arena per device (and the host staging arena) as planned,
 * initialises parameters from config.seed (PyTorch's Linear init distribution),
 * and starts one worker per extra device. The plan must outlive the context. */
dp_status dp_ctx_create(const dp_plan *p, dp_ctx **out);
/* Embedded style: the caller provides the arenas. arenas[d] must hold
 * dp_plan_device_bytes(p, d) bytes aligned to dp_plan_alignment(p), each its
 * own memory (overlapping arenas are refused); host may be NULL when
 * dp_plan_host_bytes(p) is 0. The memory stays the caller's. The context
 * object and its schedules are still allocated from the heap. */
dp_status dp_ctx_create_static(const dp_plan *p, void *const arenas[], void *host,
                               dp_ctx **out);
void dp_ctx_free(dp_ctx *c);
const char *dp_ctx_error(const dp_ctx *c);

/* One training step on `rows` (1..planned batch) rows.
 * x: (rows, cols) fp32 with cols == the model's input width. target: (rows, out) fp32 for
 * mse, (rows) int32 class indices for softmax_cross_entropy. loss (may be NULL): mean loss.
 * On any error, parameters, optimizer state and step counter are unchanged:
 * every check and every op that can fail (transfers included) runs before the
 * first write to them (see docs/RELIABILITY.md). Two errors also make the
 * context unusable, every later step and forward returning them again:
 * DP_ERR_CORRUPT (a guard was hit), and a failure reported by an op of the
 * final update itself, which cannot fail on the cpu backend. Free such a
 * context and restore from a checkpoint. */
dp_status dp_train_step(dp_ctx *c, int rows, int cols, const float *x, const void *target,
                        float *loss);
/* Inference: scatter -> replicated forward -> gather. x: (rows, cols),
 * y: (rows, out). Dropout is the identity. Works on training contexts too.
 * On error, y may hold part of the outputs; parameters are unchanged.
 * A batch smaller than planned keeps the planned cut points: the last devices
 * get fewer rows or none. */
dp_status dp_forward(dp_ctx *c, int rows, int cols, const float *x, float *y);

/* Parameters as one flat fp32 array in state_dict order (dp_model_n_params). */
dp_status dp_get_params(dp_ctx *c, float *out, size_t n);
dp_status dp_set_params(dp_ctx *c, const float *in, size_t n);
/* The gradient of the step's mean loss with respect to every parameter, in
 * state_dict order: what PyTorch leaves in .grad after loss.backward() on the
 * whole batch (the per-device contributions are summed, as DataParallel does;
 * the mean loss scales each sample by 1/rows). Those of the last step that got
 * through backward, in every mode (a sharded optimizer's shards are read from
 * the devices that own them). A step refused for non-finite gradients or a
 * non-finite update leaves its gradients here so they can be inspected; one
 * refused before any device work (bad input) does not touch them. A step
 * refused for a non-finite loss leaves them as they were on the cpu backend;
 * on cuda, whose device runs the whole step before the host sees the loss,
 * they are that step's. Zero before the first step. */
dp_status dp_get_grads(dp_ctx *c, float *out, size_t n);
uint64_t dp_ctx_step(const dp_ctx *c);
/* config.clip_grad_norm: the total L2 norm of the gradients of the last step
 * that reached its clipping (before the scaling), as clip_grad_norm_ returns
 * it; NaN before any such step, inf or NaN when a gradient was not finite (the
 * step was refused), 0 without clipping. */
float dp_ctx_grad_norm(const dp_ctx *c);
/* config.accumulate: training calls accumulated since the last update
 * (0..accumulate-1); the next call updates when it is accumulate - 1. */
int dp_ctx_accumulated(const dp_ctx *c);
/* This context's rank in its job (0 for a one-process context). */
int dp_ctx_rank(const dp_ctx *c);
/* The learning rate of the steps from now on (a schedule, PyTorch's
 * optimizer.param_groups[0]["lr"] = lr): finite and >= 0 (0: a schedule's
 * floor; AdamW: lr * weight_decay <= 1), refused otherwise with nothing changed. Allocates
 * nothing; works with cuda graphs (the rate is a per-step scalar on the
 * device). Checkpoints carry it (version 2): dp_ckpt_load restores the rate
 * in effect when it was saved, as PyTorch's optimizer.load_state_dict does. */
dp_status dp_set_lr(dp_ctx *c, float lr);
/* The learning rate in effect: config.lr until dp_set_lr changes it. */
float dp_ctx_lr(const dp_ctx *c);
/* The momentum of the steps from now on, as a schedule that cycles it sets
 * it (OneCycleLR's cycle_momentum): SGD's param_groups[0]["momentum"] for
 * DP_OPT_MOMENTUM (or DP_OPT_SGD with config.momentum > 0), finite and in
 * [0, 1); Adam's and AdamW's beta1 (param_groups[0]["betas"][0]), in [0, 1),
 * which their bias correction 1 - beta1^t then uses, as PyTorch's does. Plain
 * SGD keeps no momentum buffer: refused (DP_ERR_INVALID) there, as for an
 * inference context or a value out of range, with nothing changed. Allocates
 * nothing; works with cuda graphs (a per-step scalar on the device, as the
 * rate). Checkpoints carry it (version 4). */
dp_status dp_set_momentum(dp_ctx *c, float momentum);
/* The momentum in effect: config.momentum (SGD) or config.beta1 (Adam, AdamW)
 * until dp_set_momentum changes it; 0 for plain SGD and inference. */
float dp_ctx_momentum(const dp_ctx *c);

/* Learning-rate schedules, as torch.optim.lr_scheduler computes them; t counts
 * scheduler steps (call dp_set_lr(c, dp_lr_at(&s, t)) before each step, or each
 * epoch, as a PyTorch loop calls scheduler.step()).
 *   CONSTANT       base_lr
 *   STEP           StepLR(step_size, gamma): base_lr * gamma^floor(t / step_size)
 *   COSINE         CosineAnnealingLR(t_max, eta_min), its closed form
 *   WARMUP_COSINE  SequentialLR([LinearLR(start_factor, 1.0, warmup),
 *                  CosineAnnealingLR(t_max, eta_min)], milestones=[warmup])
 *   EXPONENTIAL    ExponentialLR(gamma): base_lr * gamma^t
 *   MULTISTEP      MultiStepLR(milestones, gamma): base_lr * gamma^(the
 *                  milestones <= t)
 *   WARMUP         LinearLR(start_factor, 1.0, warmup): base_lr * (start_factor +
 *                  (1 - start_factor) min(t, warmup) / warmup), then base_lr
 *   ONECYCLE       OneCycleLR(max_lr = base_lr, total_steps, pct_start,
 *                  anneal_strategy, cycle_momentum, base_momentum, max_momentum,
 *                  div_factor, final_div_factor, three_phase): from base_lr /
 *                  div_factor up to base_lr over pct_start of the steps, then down
 *                  to base_lr / div_factor / final_div_factor (three_phase: back to
 *                  base_lr / div_factor first). With cycle_momentum (PyTorch's
 *                  default) the momentum goes the other way, from max_momentum
 *                  down to base_momentum and back (three_phase: then stays at
 *                  max_momentum): dp_momentum_at gives it, for dp_set_momentum
 *                  (SGD's momentum, Adam's beta1). Defined for t up to total_steps
 *                  (NaN past it, where PyTorch raises). */
typedef enum {
  DP_LR_CONSTANT = 0,
  DP_LR_STEP,
  DP_LR_COSINE,
  DP_LR_WARMUP_COSINE,
  DP_LR_EXPONENTIAL,
  DP_LR_MULTISTEP,
  DP_LR_WARMUP,
  DP_LR_ONECYCLE
} dp_lr_kind;
#define DP_LR_MAX_MILESTONES 16
typedef struct {
  dp_lr_kind kind;
  float base_lr;      /* the optimizer's initial lr */
  int step_size;      /* STEP: steps between decays (>= 1) */
  float gamma;        /* STEP, EXPONENTIAL, MULTISTEP: the factor of each decay, (0, 1];
                         taken as the shortest decimal that rounds to it (0.9999f as
                         0.9999), the gamma a PyTorch script writes */
  int warmup;         /* WARMUP_COSINE, WARMUP: steps of linear warm-up (>= 1) */
  float start_factor; /* WARMUP_COSINE, WARMUP: the warm-up's first factor, (0, 1] */
  int t_max;          /* COSINE, WARMUP_COSINE: the cosine's half period (>= 1) */
  float eta_min;      /* COSINE, WARMUP_COSINE: the floor, [0, base_lr] */
  int n_milestones;   /* MULTISTEP: 1..DP_LR_MAX_MILESTONES */
  int milestones[DP_LR_MAX_MILESTONES]; /* MULTISTEP: increasing steps, >= 1 */
  /* ONECYCLE (appended: the fields above keep their offsets); base_lr is
   * max_lr. pct_start, div_factor and final_div_factor are taken as gamma is
   * (the shortest decimal that rounds to the float). */
  int total_steps;        /* >= 1 */
  float pct_start;        /* [0, 1]; PyTorch's default 0.3 */
  int anneal_linear;      /* 0: anneal_strategy 'cos' (the default), 1: 'linear' */
  float div_factor;       /* > 0; 25 */
  float final_div_factor; /* > 0; 1e4 */
  int three_phase;        /* 0 (the default) or 1 */
  int cycle_momentum;     /* 1 (PyTorch's default): the momentum cycles too; 0: the
                             rate alone (cycle_momentum=False) */
  /* ONECYCLE with cycle_momentum (appended): the momentum's bounds, each in
   * [0, 1), taken as the decimal a script writes (as gamma) */
  float base_momentum; /* 0.85 */
  float max_momentum;  /* 0.95 */
} dp_lr_schedule;
/* A ONECYCLE schedule with PyTorch's defaults (pct_start 0.3, 'cos', div_factor
 * 25, final_div_factor 1e4, two phases, cycle_momentum on between 0.85 and
 * 0.95): every other field zero. */
void dp_lr_schedule_onecycle(dp_lr_schedule *s, float max_lr, int total_steps);
/* DP_OK, or DP_ERR_INVALID naming the field out of range. */
dp_status dp_lr_schedule_check(const dp_lr_schedule *s);
/* The rate at scheduler step t; NaN for a schedule dp_lr_schedule_check refuses. */
float dp_lr_at(const dp_lr_schedule *s, uint64_t t);
/* The momentum at scheduler step t of a schedule that cycles it (ONECYCLE with
 * cycle_momentum; call dp_set_momentum(c, dp_momentum_at(&s, t)) with each
 * dp_set_lr); NaN for every other schedule, and for one dp_lr_schedule_check
 * refuses. Step 0's is max_momentum: OneCycleLR sets it when it is made, so
 * create the context with that momentum (SGD: config.momentum, even where the
 * script's SGD had none, as PyTorch's OneCycleLR then gives it one; Adam:
 * config.beta1). */
float dp_momentum_at(const dp_lr_schedule *s, uint64_t t);
/* Steps skipped under DP_NONFINITE_SKIP since the context was created. */
uint64_t dp_ctx_skipped_steps(const dp_ctx *c);
/* Checks every arena guard now: DP_OK when all hold, DP_ERR_CORRUPT (naming
 * the device and region; the context becomes unusable) when one was written,
 * DP_ERR_UNSUPPORTED when the plan has no guards. */
dp_status dp_ctx_check_guards(dp_ctx *c);

/* Checkpoints: parameters, optimizer state and the step counter (which is the
 * RNG position: every random number is keyed by seed and step), in a versioned
 * file with a checksum per section. The state is stored in its logical layout,
 * so a checkpoint loads into any device count and mode. Saving writes a
 * temporary file, fsyncs it, renames it over `path` and fsyncs the directory
 * (dp_file_create, below): a crash leaves the old file or the new one, never
 * a mix. Loading checks the
 * model, optimizer and seed match and every checksum before touching the
 * context; on any error the context is unchanged. A path that is not a regular
 * file (a directory, a FIFO, a device) is refused with DP_ERR_IO without
 * blocking. Both allocate temporary host buffers (the size of the state);
 * only the step and forward calls are allocation-free. */
dp_status dp_ckpt_save(dp_ctx *c, const char *path);
dp_status dp_ckpt_load(dp_ctx *c, const char *path);
/* dp_ckpt_save with application data: app_bytes (at most 16 MiB) at `app`
 * ride in the checkpoint (its APPD section, checksummed like the rest, opaque
 * to libdp): what a training loop needs to continue exactly (dp train keeps
 * its input standardisation, position in the data and schedule there).
 * dp_ckpt_save writes none; dp_ckpt_load ignores it. dp_ckpt_read_app gives
 * a file's data back: *app from malloc (free it), NULL with *bytes 0 when
 * there is none (also for files of format versions 1 and 2). */
dp_status dp_ckpt_save_app(dp_ctx *c, const char *path, const void *app, size_t app_bytes);
/* The size of the file dp_ckpt_save_app(c, path, app, app_bytes) would write
 * now (the model text, parameters, buffers, optimizer state and app_bytes of
 * application data); 0 for a NULL context, SIZE_MAX for a size past size_t's
 * (dp_ckpt_save_app takes at most 16 MiB). With dp_file_room, a program can
 * find before training that the checkpoint will not fit. */
size_t dp_ckpt_bytes(const dp_ctx *c, size_t app_bytes);
dp_status dp_ckpt_read_app(const char *path, void **app, size_t *bytes);
/* What a checkpoint file holds, without a context: its model (parsed from
 * the spec text it carries; *model may be NULL to skip it; free it with
 * dp_model_free) and its header fields. Reads only the beginning of the file;
 * the rest is checked by dp_ckpt_load. */
typedef struct {
  unsigned version; /* file format version */
  size_t n_params;
  uint64_t seed;
  dp_optimizer optimizer;
  int inference; /* saved from an inference context: parameters only */
  size_t file_bytes;
  int amsgrad; /* appended: saved with config.amsgrad (v_hat among its state) */
} dp_ckpt_summary;
dp_status dp_ckpt_info(const char *path, dp_model **model, dp_ckpt_summary *out);
/* Weights to and from PyTorch, as a safetensors file (safetensors.torch's
 * save_file / load_file): the parameters named and shaped as the state_dict of
 * the model's nn.Sequential (dp_model_tensor: "0.weight" (out, in), "0.bias",
 * ...), F32, with metadata {"format": "pt", "libdp_model": the spec text}.
 * Export writes the file as dp_ckpt_save does (atomically). Import takes a
 * file with exactly the model's tensors (any order, any other metadata; F32
 * only: other dtypes, missing, extra or misshapen tensors and non-finite
 * values are refused, naming the tensor, with the context unchanged) and sets
 * the parameters as dp_set_params does: optimizer state and step counter stay
 * as they were (a fresh context: a PyTorch-initialised model to train). */
dp_status dp_ckpt_export_safetensors(dp_ctx *c, const char *path);
dp_status dp_ckpt_import_safetensors(dp_ctx *c, const char *path);
/* A program's own metadata in the file: key/value strings (safetensors'
 * "__metadata__" is a map of strings to strings). dp_ckpt_export_safetensors_meta
 * is dp_ckpt_export_safetensors with n_meta more pairs after "format" and
 * "libdp_model", in the order given: keys non-empty, unique, neither of those
 * two; keys and values valid UTF-8 (C strings: no NUL); else DP_ERR_INVALID
 * naming the key, before anything is written. dp_safetensors_read_meta reads
 * any safetensors file's metadata (its header only, as the format has it:
 * every value a string, no key twice; stricter than the import, which checks
 * only that "__metadata__" is one JSON object): *n_meta pairs in file order,
 * "format" and "libdp_model" included, \u escapes decoded (a NUL is refused),
 * in one malloc'd block at *meta (free(*meta)); NULL and 0 when the file has
 * none. DP_ERR_IO, DP_ERR_PARSE (the file named), DP_ERR_NOMEM. */
typedef struct {
  const char *key, *value;
} dp_meta;
dp_status dp_ckpt_export_safetensors_meta(dp_ctx *c, const char *path, const dp_meta *meta,
                                          int n_meta);
dp_status dp_safetensors_read_meta(const char *path, dp_meta **meta, int *n_meta);

/* Files written whole (checkpoints and safetensors exports use this; so do the
 * dp tool's predictions and charts), public so that a program writes its
 * files the same way. dp_file_create makes a new temporary file in path's
 * directory, "<path>.tmp.<12 random hex digits>" (a file name of more than
 * 238 bytes cut to leave room for the suffix), with O_CREAT | O_EXCL |
 * O_NOFOLLOW and mode 0600 (an existing file or a link planted at the name is
 * never opened; another name is drawn on a clash); write the content to
 * dp_file_stream(f) (a stdio stream of libdp's, without a file descriptor:
 * fileno gives -1; the first failed write's reason is kept for the
 * message). dp_file_commit flushes it, sets its mode to 0666 less
 * the umask (what a new file gets from fopen), fsyncs it, renames it over
 * path and fsyncs the directory: a crash leaves the old file or the new one.
 * dp_file_discard abandons it. Both free f, and on any failure the temporary
 * file is removed and path is as it was.
 * Only a regular file or nothing may be at path: a directory, FIFO, socket or
 * device there is refused (DP_ERR_IO "cannot write <what> '<path>': is a
 * character device, not a regular file"), by dp_file_create and again just
 * before the rename, and left untouched. A symbolic link at path is replaced
 * by the rename (not followed: its target is not written) when it names a
 * regular file or nothing, and refused like its target otherwise. `what`
 * names the file in messages ("checkpoint"). Errors go to dp_last_error(). */
typedef struct dp_file dp_file;
dp_status dp_file_create(const char *path, const char *what, dp_file **f);
FILE *dp_file_stream(dp_file *f);
dp_status dp_file_commit(dp_file *f);
void dp_file_discard(dp_file *f); /* NULL: nothing */
/* A file written in place and appended to (a log that `tail -f` follows):
 * opened with O_APPEND | O_NOFOLLOW | O_NONBLOCK, created (mode 0666 less the
 * umask) when missing, and kept only if it is a regular file: a symbolic link
 * at path is refused (opening it would follow it), and so is anything that is
 * not a regular file. truncate: emptied after that check. *out: fclose it. */
dp_status dp_file_append(const char *path, const char *what, int truncate, FILE **out);
/* Whether path can be written as dp_file_create (in_place 0) or
 * dp_file_append (in_place 1) would write it, before the work that makes the
 * content: the same refusals, and a temporary file (or, in place, the missing
 * file) is created and removed again, so that a missing or read-only
 * directory fails now. Nothing at path is created, truncated or followed. */
dp_status dp_file_check(const char *path, const char *what, int in_place);
/* Whether the file system that would hold path has room for `bytes` more
 * (statvfs: the blocks free to this process, root's reserve included for
 * root): DP_ERR_IO "no room for checkpoint 'x.ckpt': its file system has 1.2
 * MB free, and it takes 7.5 MB" otherwise. A check before long work, not a
 * promise: other writers may fill the disk meanwhile, and the write itself
 * still reports a full disk. */
dp_status dp_file_room(const char *path, const char *what, size_t bytes);
/* Highest arena byte any op has touched, per device: after a step, the end of
 * the device's last non-empty region, which is the plan's total
 * (dp_plan_device_bytes) less the final alignment padding; in bf16 plans it
 * may end inside the workspace, whose shadow area (sized for the widest
 * shadowed op's fp32 copies) can go partly untouched (docs/API.md). */
size_t dp_ctx_high_water(const dp_ctx *c, int dev);
/* FNV-1a 64 of the parameter bytes. */
uint64_t dp_params_hash(dp_ctx *c);

/* ---- profile (dp bench step --profile) --------------------------------------
 * Where a step's time goes: while a profile is on, every op a device's thread
 * runs (its element range of a shared op too), every wait of a thread at a
 * barrier and every dp_train_step / dp_forward call leave one event, with
 * CLOCK_MONOTONIC times, in the caller's buffer. Off (the default) it costs a
 * test per op; on, two clock reads and an atomic add per event; never an
 * allocation. Events past the buffer's end are counted, not written. The
 * times are the host's: an asynchronous backend's ops only enqueue. */
typedef enum {
  DP_PROF_EVENT_OP = 0,  /* an op, or a thread's range (a loss op: micro-batches)
                            of a shared op */
  DP_PROF_EVENT_BARRIER, /* a thread waiting for the others (or for its next job) */
  DP_PROF_EVENT_STEP     /* one dp_train_step or dp_forward call, caller's thread */
} dp_prof_event_kind;

typedef struct {
  uint64_t t0_ns, t1_ns; /* CLOCK_MONOTONIC */
  uint64_t cpu_ns;       /* ops: the thread's CPU time in between (what it ran;
                            t1 - t0 - cpu: the time its core was taken) */
  uint8_t what;          /* dp_prof_event_kind */
  uint8_t kind;          /* an op's dp_op_kind */
  uint8_t phase;         /* an op's dp_phase; a barrier's: the phase of the stage
                            it ends (DP_PHASE_COUNT: a worker's wait for a job) */
  uint8_t shared;        /* 1: this thread's part of a shared op */
  int16_t thread;        /* the device whose thread recorded it */
  int16_t device, layer; /* an op's device and layer (-1: none) */
  int32_t op;            /* an op's index in its schedule; -1 for other events */
} dp_prof_event;

/* Starts recording into events[0, cap) (from index 0; replaces a profile that
 * was on); NULL events stops. The buffer must stay valid until stopped. */
dp_status dp_ctx_profile(dp_ctx *c, dp_prof_event *events, size_t cap);
/* Events recorded since the profile started (at most cap); *dropped (may be
 * NULL): those that did not fit. Read between steps. */
size_t dp_ctx_profile_count(const dp_ctx *c, size_t *dropped);

/* Classes of ops, for a summary (dp_prof_class_of). */
typedef enum {
  DP_PROF_FWD_GEMM = 0, /* forward of a layer that is GEMMs: linear, conv2d, attention */
  DP_PROF_FWD_OTHER,    /* forward of any other layer (activations, norms, pools, ...) */
  DP_PROF_LOSS,         /* the loss and its gradient, the loss sum */
  DP_PROF_BACKWARD,     /* every layer's backward */
  DP_PROF_REDUCE,       /* the gradient reduction: copies, in-place and gradient adds */
  DP_PROF_TRANSFER,     /* broadcast, scatter and gather copies */
  DP_PROF_OPTIMIZER,    /* the check, norm, clip, accumulation and the update */
  DP_PROF_CLASS_COUNT
} dp_prof_class;

/* An op event's class (by its kind, phase and layer); -1 for other events. */
int dp_prof_class_of(const dp_plan *p, const dp_prof_event *ev);
const char *dp_prof_class_name(dp_prof_class k); /* "forward gemm", ... */

/* A profile's totals, milliseconds summed over its steps. Every op and
 * barrier event counts in the call that recorded it (the first step event
 * after it in the buffer), clipped to that call's window (a worker's wait for
 * the call's job starts in the call before); events after the last step event
 * are left out. Per device's thread: busy (its ops, by class) + barrier
 * (waits) + other = the steps' wall time, where other is what the thread
 * spent outside ops and barriers (device 0's thread: the call's own host work
 * between the executor's runs). busy_cpu: the CPU time of its ops (busy -
 * busy_cpu: the time its core was taken during its ops). */
typedef struct {
  int steps;     /* step events */
  int n_threads; /* threads with events: devices 0 .. n_threads - 1 */
  double wall_ms;
  double busy_ms[DP_MAX_DEVICES][DP_PROF_CLASS_COUNT];
  double busy_cpu_ms[DP_MAX_DEVICES];
  double barrier_ms[DP_MAX_DEVICES], other_ms[DP_MAX_DEVICES];
  long ops[DP_PROF_CLASS_COUNT]; /* op events of each class (all threads) */
} dp_prof_summary;

dp_status dp_prof_summarize(const dp_plan *p, const dp_prof_event *ev, size_t n,
                            dp_prof_summary *out);
/* A batchnorm layer's running statistics (buffers, not parameters: they are in
 * checkpoints and the safetensors export, not in dp_get_params): C floats of
 * running_mean and of running_var, and num_batches_tracked (any may be NULL).
 * layer: the index among the layer lines after `input`. DP_ERR_INVALID when
 * it is not a batchnorm. Across processes: collective, rank 0's (device 0's). */
dp_status dp_get_running_stats(dp_ctx *c, int layer, float *mean, float *var,
                               int64_t *count);

/* ---- CUDA ------------------------------------------------------------------
 * The CUDA backend is a library of its own, libdp_cuda.a (pkg-config dp-cuda;
 * built where nvcc was found), so that a CPU-only program links libdp.a with
 * -lm -pthread and nothing else. A program that wants it links libdp_cuda.a
 * and calls dp_cuda_register() once, before planning for DP_BACKEND_CUDA;
 * until then such a plan is refused (DP_ERR_UNSUPPORTED). Registering twice
 * is harmless. dp_cuda_register is defined in libdp_cuda.a only. */
dp_status dp_cuda_register(void);
/* 1 when the CUDA backend is registered. */
int dp_cuda_available(void);
/* Number of visible GPUs; 0 with a reason in dp_last_error() when none (or
 * when the CUDA backend is not registered). */
int dp_cuda_device_count(void);

/* ---- inspection, names and diagnostics --------------------------------------
 * What a tool (the `dp` command, a service's own reports) needs to describe a
 * model, a plan or the machine without the library's internals. None of it
 * allocates except dp_bench_sgemm. */

/* One layer of a model (index i = the module index of the equivalent PyTorch
 * nn.Sequential: activations and dropout are modules too). */
typedef struct {
  dp_layer_kind kind;
  int in, out;         /* widths */
  int bias;            /* linear: 1 with a bias, 0 with `nobias`; 0 otherwise */
  float p;             /* dropout probability; 0 otherwise */
  size_t param_offset; /* first parameter (in floats) in the state_dict-ordered array */
  size_t n_params;     /* 0 for layers without parameters */
  /* the output's shape: channels x height x width (height and width 0: flat,
   * channels == out); conv2d and pools: kernel, stride, padding */
  int channels, height, width;
  int kernel, stride, padding;
  /* sequences: positions T (0: not a sequence; channels is then the width
   * per position), embedding: vocab; attention: heads; a residual block's
   * begin and end: the other's layer index; its shortcut: the begin's */
  int positions, vocab, heads, link;
  int tied; /* linear: its weight is the token embedding's (param_offset is the
               table's, n_params 0); embedding: a linear shares its table */
  float eps;      /* layernorm, batchnorm: added to the variance; 0 otherwise */
  float momentum; /* batchnorm: the running statistics' momentum, or
                     DP_BN_MOMENTUM_NONE (the cumulative average); 0 otherwise */
  float negative_slope; /* leaky_relu; 0 otherwise */
  int exclude_pad;      /* avgpool2d with count_include_pad=False; 0 otherwise */
} dp_layer_info;

/* Layer i, 0 <= i < dp_model_n_layers(m). DP_ERR_INVALID for a NULL model or
 * out; DP_ERR_RANGE for i out of range (*out is zeroed on any error). */
dp_status dp_model_layer(const dp_model *m, int i, dp_layer_info *out);

/* One parameter tensor, named and shaped as in PyTorch's state_dict of the
 * equivalent nn.Sequential: "0.weight" (out, in) and "0.bias" (out) for a
 * linear at index 0; "3.weight" (n) and "3.bias" (n) for a layernorm at 3. */
typedef struct {
  char name[48];
  int ndim;      /* 1, 2 or (conv2d's weight: out, in, k, k) 4 */
  int dims[4];   /* dims[d] is 0 for d >= ndim */
  size_t offset; /* first element (in floats) in the array dp_get_params fills */
  size_t numel;  /* the product of the dims; the tensors tile 0 .. dp_model_n_params */
} dp_tensor_info;

/* The parameter tensors, in state_dict order (0 for a NULL model). */
int dp_model_n_tensors(const dp_model *m);
/* Tensor i, 0 <= i < dp_model_n_tensors(m); errors as dp_model_layer. */
dp_status dp_model_tensor(const dp_model *m, int i, dp_tensor_info *out);

/* FNV-1a 64 of n bytes: the hash dp_params_hash computes over the parameter
 * bytes (so dp_hash_bytes of dp_get_params' array equals it) and dp repro
 * reports per tensor. data may be NULL when n is 0. */
uint64_t dp_hash_bytes(const void *data, size_t n);

/* Names of enum values: the words of the spec text and of the `dp` command
 * line ("linear", "softmax_cross_entropy", "none", "chunk", "classic",
 * "adamw", "nccl"); "?" for a value out of range. The library's one table
 * per enum (dp_backend_name, dp_region_name, dp_phase_name, dp_op_kind_name
 * and dp_status_name are declared with their enums). */
const char *dp_layer_kind_name(dp_layer_kind k);
const char *dp_loss_name(dp_loss_kind l);
const char *dp_split_name(dp_split s);
const char *dp_mode_name(dp_mode m);
const char *dp_optimizer_name(dp_optimizer o);
const char *dp_transport_name(dp_transport t);
const char *dp_bn_mode_name(dp_bn_mode m);

/* The CPU GEMM tier in use: "avx512", "avx2" or "scalar" (every tier gives
 * the same bits; DP_GEMM_TIER in the environment picks the first one). */
const char *dp_gemm_tier(void);
/* Switches the CPU GEMM tier, for benchmarks and tests; call it while no
 * step runs. NULL or "auto": the best the CPU supports. An unknown name is
 * DP_ERR_INVALID, a tier this CPU lacks DP_ERR_UNSUPPORTED; either way
 * nothing changes. "avx512bf16": avx512 with the bf16 GEMM on the
 * AVX512_BF16 instruction ("avx512": emulated, the same bits). */
dp_status dp_gemm_set_tier(const char *tier);

/* Times one bf16 GEMM (config.precision bf16's: bf16 operands, fp32
 * accumulation, bf16 output) of m x n x k as dp_bench_sgemm times the FP32
 * one: cpu only (the tier in use; device 0), DP_ERR_UNSUPPORTED elsewhere. */
dp_status dp_bench_gemm_bf16(dp_backend backend, int device, int m, int n, int k, int iters,
                             double *ms_per_gemm);
/* Times one FP32 GEMM of m x n x k (m, n, k >= 1) on `device` of `backend`:
 * *ms_per_gemm is the mean over `iters` (>= 1) runs after one warm-up run.
 * Allocates (and frees) its own operands: not for a fixed-budget process's
 * steady state.
 *   cpu:  libdp's CPU GEMM, on the calling thread, in the linear layer's
 *         forward layout C (m, n) = A (m, k) . B (n, k)^T, with the tier in
 *         use; device must be 0 and tf32 0 (DP_ERR_INVALID otherwise).
 *   cuda: cuBLAS C (m, n) = A (m, k) . B (k, n) on GPU `device` through the
 *         registered backend, TF32 tensor cores when tf32 is 1;
 *         DP_ERR_UNSUPPORTED when the CUDA backend is not registered; the
 *         CUDA error (no GPU, ...) otherwise. */
dp_status dp_bench_sgemm(dp_backend backend, int device, int m, int n, int k, int iters,
                         int tf32, double *ms_per_gemm);
/* Name (NUL-terminated, cut to cap) and memory of GPU `gpu`; any output may
 * be NULL. Reading the free memory creates the GPU's CUDA context.
 * DP_ERR_UNSUPPORTED when the CUDA backend is not registered. */
dp_status dp_cuda_device_info(int gpu, char *name, size_t cap, size_t *total_mem,
                              size_t *free_mem);

#ifdef __cplusplus
}
#endif
#endif
