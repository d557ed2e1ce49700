/* kernel.h - the kernel model (docs/BACKEND.md) that `fuse`, `memplan`,
 * the cost model and both code generators share: which ops the executor
 * runs itself, which fit a row kernel, how a row kernel's values lie over
 * its iteration space, and which values are views of others. */
#ifndef GRADC_KERNEL_H
#define GRADC_KERNEL_H

#include "ir/ir.h"
/* ------------------------------------------------------------------ */
/* kernel.c: what a kernel is (shared by `fuse` and the generators)    */
/* ------------------------------------------------------------------ */
/* What an op does over a row. */
typedef enum {
  KP_ROW_NONE,    /* not a row op */
  KP_ROW_EW,      /* elementwise (and broadcast, grad.seed, loss.term, mse_loss "none") */
  KP_ROW_RED,     /* sum, mean, max over the row */
  KP_ROW_COLSUM,  /* sum over the axis before the row (keepdim): each column summed over a
                     group of rows, written once the group is done (kp_op_colsum) */
  KP_ROW_LSE,     /* logsumexp over the row */
  KP_ROW_SOFTMAX, /* softmax, log_softmax */
  KP_ROW_LN,      /* mean and variance, then scale and shift */
  KP_ROW_RMS,     /* mean square, then scale */
  KP_ROW_CE,      /* cross_entropy "none": a loss per row */
  KP_ROW_ONEHOT,
  KP_ROW_EMB,     /* embedding: the table gathered by index */
  KP_ROW_CMASK,   /* causal_mask */
  KP_ROW_UNSLICE, /* the operand gathered where the slice puts it */
  KP_ROW_RAND,    /* random: Philox draws of the element's counter; the state is read by index */
} KpRowKind;

/* The loop nest an op needs when it is a kernel of its own. */
typedef enum {
  KP_LOOP_NONE,           /* no loop nest: a row kernel or an executor op */
  KP_LOOP_PERMUTE,        /* a gather of each output row (or element) */
  KP_LOOP_TRANSPOSE,      /* a permute moving the contiguous axis: tiles */
  KP_LOOP_SLICE,
  KP_LOOP_UNSLICE,        /* zeros with the slice's region filled in */
  KP_LOOP_CONCAT,
  KP_LOOP_REDUCE,         /* sum, mean, max, logsumexp over leading axes */
  KP_LOOP_SOFTMAX,        /* softmax, log_softmax over a leading axis */
  KP_LOOP_CE_TOTAL,       /* cross_entropy reduced to a scalar */
  KP_LOOP_MSE_TOTAL,      /* mse_loss reduced to a scalar */
  KP_LOOP_EMBEDDING_GRAD, /* scatter-add into the table's rows */
  KP_LOOP_PATCHES,        /* im2col: a gather of each patch element (or the padding value) */
  KP_LOOP_PATCHES_GRAD,   /* col2im: each image element sums the patch elements that read it */
  KP_LOOP_ARANGE,         /* y[i] = i */
  KP_LOOP_GATHER,         /* gather: a row of the result per iteration */
  KP_LOOP_GATHER_GRAD,    /* gather_grad: a block of lines along the axis, zeroed then scatter-added */
  KP_LOOP_TOPK,           /* topk: k selections along each line of the axis */
} KpLoopKind;

/* kernel.c's op table: what the kernel model does with each op. */
KpRowKind kp_row_kind(IrOpcode opc);
/* What op does over a row: kp_row_kind, or KP_ROW_COLSUM for a column sum. */
KpRowKind kp_op_row_kind(const IrOp *op);
/* A column sum: sum over exactly the axis before the last (keepdim=true) of
 * an f32 or f64 operand of rank >= 3 whose leading axes hold at least
 * KP_COLSUM_MIN_GROUPS groups of rows.  In a row kernel with other ops it
 * makes each parallel iteration a group of rows; alone it is a loop
 * kernel (kp_op_row_alone). */
#define KP_COLSUM_MIN_GROUPS 4
bool kp_op_colsum(const IrOp *op);
bool kp_colsum_operand(const IrType *t); /* whether that sum of a value of type t is one */
/* KP_LOOP_PERMUTE for any permute (kp_loop_plan tells a transpose). */
KpLoopKind kp_loop_kind(IrOpcode opc);
/* The case labels of every op that is not POINT (ops.def), the last without its
 * colon: a switch over the elementwise ops ends with `KP_CASES_NOT_EW:`
 * and -Wswitch-enum still checks that it covers every op. */
#define KP_CASES_NOT_EW \
  IR_CASES(CONST) \
  IR_CASES(REDUCE) \
  IR_CASES(GEMM) \
  IR_CASES(COLLECTIVE) \
  IR_CASES(OUTPUT) \
  IR_CASES(NORM) \
  case IR_OP_RESHAPE: \
  case IR_OP_PERMUTE: \
  case IR_OP_SLICE: \
  case IR_OP_UNSLICE: \
  case IR_OP_CONCAT: \
  case IR_OP_SOFTMAX: \
  case IR_OP_LOG_SOFTMAX: \
  case IR_OP_CAUSAL_MASK: \
  case IR_OP_EMBEDDING: \
  case IR_OP_EMBEDDING_GRAD: \
  case IR_OP_CROSS_ENTROPY: \
  case IR_OP_ONE_HOT: \
  case IR_OP_PATCHES: \
  case IR_OP_PATCHES_GRAD: \
  case IR_OP_ARANGE: \
  case IR_OP_GATHER: \
  case IR_OP_GATHER_GRAD: \
  case IR_OP_TOPK: \
  case IR_OP_WINDOW_SUM: \
  case IR_OP_LOSS_SCALE: \
  case IR_OP_RANDOM
/* Ops the executor runs itself (docs/BACKEND.md): matmul, reshape, const,
 * window.sum, loss, grad and the collectives.  Every other op is in a
 * kernel (IrOp.group >= 1). */
bool kp_op_group0(IrOpcode opc);
/* Whether op fits a row kernel: elementwise ops, broadcast, reductions over
 * the last axis only, softmax/log_softmax over the last axis, the norms,
 * causal_mask, cross_entropy and mse_loss with reduction="none",
 * one_hot, embedding, unslice, grad.seed and loss.term.  Other kernel ops
 * (permute, slice, concat, embedding_grad, other reductions, ...) are
 * kernels of their own with a general loop nest. */
bool kp_op_rowwise(const IrOp *op);
/* Whether op, as a kernel of its own, is a row kernel (else a loop kernel). */
bool kp_op_row_alone(const IrOp *op);

/* A row kernel iterates over an iteration shape `space` [..., cols]: the
 * outer (parallel) loop runs over the rows (the product of the leading
 * axes), inner loops over the cols of one row.  Every value the kernel
 * touches is laid over the space by NumPy broadcasting, right-aligned
 * either to the last axis (eoff 0) or to the one before it (eoff 1: a
 * per-row value whose last axis was reduced away, such as a target index
 * or a cross_entropy row loss). */
typedef struct KpSlot {
  IrValue *v;
  int eoff;     /* 0 or 1, see above */
  bool mapped;  /* laid over the space (false: only an embedding table or an unslice
                   operand, addressed by index) */
  bool defined; /* defined by an op of the kernel; false: a kernel input */
  bool output;  /* defined here and used outside the kernel */
  bool varies;  /* varies along the row (one value per element); false: one value per row */
  bool colsum;  /* a column sum's result: complete (and written) once its group of rows is done */
} KpSlot;

typedef struct KpRowLayout {
  IrShape space;
  int64_t rows, cols;
  int64_t group; /* rows per parallel iteration: 1, or the space's axis before the row when a
                    column sum (KP_ROW_COLSUM) accumulates over it */
  KpSlot *slots; /* inputs and results, in order of first appearance */
  int nslots;
} KpRowLayout;

/* Whether a value defined by one of the kernel's ops is used outside it. */
typedef bool (*KpUsedOutside)(const IrValue *v, void *ctx);

/* Lay the row kernel made of ops[0..n) (in program order) over its
 * iteration space.  False with a reason in why when the ops do not form
 * one row kernel (mismatched rows, a cross-row dependence, an output that
 * would be written by several rows, ...).  Slots live in arena a. */
bool kp_row_layout(IrOp *const *ops, int n, KpUsedOutside used_outside, void *ctx, Arena *a, KpRowLayout *out,
                   char *why, size_t whylen);
KpSlot *kp_row_slot(const KpRowLayout *l, const IrValue *v); /* NULL if v is not in the kernel */
/* The element strides of slot s over the space's axes (0 where broadcast). */
void kp_slot_strides(const KpRowLayout *l, const KpSlot *s, int64_t *stride);

/* The kernels of a function: each group >= 1 of its ops, which must be
 * contiguous in the op list, as a row kernel or a loop kernel of one op. */
typedef struct KpKernel {
  int group;
  IrOp **ops; /* into the function's op list */
  int n;
  const char *name; /* "k7_layer_norm_gelu": k<group>_ and up to three distinct op names */
  bool row;         /* a row kernel laid out as layout; else a loop kernel of ops[0] */
  KpRowLayout layout;
} KpKernel;

typedef struct KpKernels {
  KpKernel *k; /* in program order */
  int n;
  int maxgroup;
  bool *used_outside; /* by value id: read outside the kernel that defines it */
} KpKernels;

/* Find f's kernels (in arena a); false with a message when a group is not
 * contiguous or not one row kernel. */
bool kp_kernels_find(const IrFunc *f, Arena *a, KpKernels *out, char *err, size_t errlen);

/* Normalised start and step of each axis of a slice or unslice op over
 * `full` (the slice's operand shape, the unslice's result shape), as
 * Python's slice.indices. */
void kp_slice_ranges(const IrOp *op, const IrShape *full, int64_t *start, int64_t *step);
/* Whether a slice or unslice selects one contiguous run of the full
 * tensor's elements (an index of leading axes and a unit-step range of
 * the next, the rest whole: a stacked param's w[l]); *first gets the
 * run's first element.  Such a slice needs no copy (memplan aliases it). */
bool kp_slice_contiguous(const IrOp *op, int64_t *first);

/* Strided views that GEMMs read and write in place (docs/BACKEND.md).
 * Element (i0, ..., ik) of a view is element offset + sum ij * stride[j]
 * of its root's buffer (the root is contiguous). */
typedef struct KpView {
  const IrValue *root;
  int64_t offset;
  IrShape shape;
  int64_t stride[IR_MAX_RANK];
} KpView;

/* Where a value lives when GEMMs read or write it through views:
 * KP_MEM      stored as usual (or an alias: a reshape of a stored value,
 *             a range slice)
 * KP_VIEW_IN  a permute, non-range slice or reshape of a view, read only
 *             by GEMMs (and views): no storage, the GEMM reads its root
 *             with strides (a transpose of the last two axes is a
 *             transpose flag)
 * KP_VIEW_OUT a GEMM's result read once by a permute or reshape (and so
 *             on) ending in a stored value, or in one part of a concat
 *             whose parts are all such: no storage, the GEMM writes
 *             straight into that value's buffer with strides */
enum { KP_MEM, KP_VIEW_IN, KP_VIEW_OUT };

/* Every value's readers: for value id v, ops op[start[v] .. start[v] + n[v])
 * read it as their operand arg[...]. */
typedef struct KpUses {
  int *start, *n;
  const IrOp **op;
  int *arg;
} KpUses;

typedef struct KpViews {
  unsigned char *place; /* by value id */
  const IrOp **user;    /* by value id: the op a KP_VIEW_OUT value is written through */
  int n;
  KpUses uses;          /* the function's readers of every value */
} KpViews;

/* Classify every value of f; `outside(op, ctx)` says whether op runs
 * outside kernels (memplan, the executor: group 0; fuse: the candidates
 * it has not put in a kernel).  Only f32/f64 values become views.  Free
 * with kp_views_free. */
void kp_views_find(const IrFunc *f, bool (*outside)(const IrOp *op, void *ctx), void *ctx, KpViews *out);
void kp_views_free(KpViews *vs);
/* Whether op does no work of its own: its result is a view, or it only
 * receives GEMM writes (a permute, reshape or concat of KP_VIEW_OUT values). */
bool kp_view_free_op(const KpViews *vs, const IrOp *op);
/* The value whose buffer v's bytes are in (v itself when stored). */
const IrValue *kp_view_home(const KpViews *vs, const IrValue *v);
/* The view a GEMM reads v through (v whole when stored). */
bool kp_view_in(const KpViews *vs, const IrValue *v, KpView *out);
/* The view a GEMM writes its result v through (v whole when stored). */
bool kp_view_out(const KpViews *vs, const IrValue *v, KpView *out);
/* v whole, contiguous. */
void kp_view_whole(const IrValue *v, KpView *out);
/* The view of op's result given the view of its operand (permute, slice,
 * reshape); false when it is not a strided view. */
bool kp_view_apply(KpView *v, const IrOp *op);
/* The view of op's operand `operand` given the view of its result
 * (permute, reshape, concat). */
bool kp_view_unapply(KpView *v, const IrOp *op, int operand);
/* The last two axes as a BLAS matrix: unit stride along the last (trans
 * false) or the second last (trans true), *ld the other stride; false if
 * neither. */
bool kp_view_matrix(const KpView *v, bool *trans, int64_t *ld);

/* ------------------------------------------------------------------ */
/* kernel_loop.c: the plan of a loop kernel (one op that fits no rows) */
/* ------------------------------------------------------------------ */
/* Row-major element strides of a shape. */
void kp_contiguous(const IrShape *s, int64_t *st);
/* Axes dims[0..n) with element strides stride[] as fewer axes: those of
 * extent 1 dropped, each run that is contiguous in memory merged into one
 * (extents ext, strides st, row-major); returns their count. */
int kp_merge_axes(const int64_t *dims, const int64_t *stride, int n, int64_t *ext, int64_t *st);


#define KP_TILE 32 /* a transpose's tiles are KP_TILE x KP_TILE */

/* A reduction over leading axes of x: x's axes end in a contiguous suffix
 * of blk elements that are all kept (cols: the last axis is kept) or all
 * reduced; before it, nk kept axes (extents kd, strides ks in x) and nr
 * reduced ones (rd, rs). */
typedef struct KpReduce {
  bool cols;
  int64_t blk;
  int nk, nr;
  int64_t kd[IR_MAX_RANK], ks[IR_MAX_RANK], rd[IR_MAX_RANK], rs[IR_MAX_RANK];
  int64_t outer; /* product of kd */
  int64_t mred;  /* product of rd */
  int64_t count; /* elements summed into one output (a mean divides by it) */
} KpReduce;

/* The index space of a loop kernel; only the fields of its kind are set. */
typedef struct KpLoopPlan {
  const IrOp *op;
  KpLoopKind kind;
  /* permute, transpose, slice: the operand stride of each result axis;
   * slice: base, the first element read */
  int64_t st[IR_MAX_RANK], base;
  /* transpose: result axis t reads the operand's contiguous axis; os the
   * result's strides; the m other axes (all but t and the last): extents
   * od, operand strides ist, result strides ost, outer elements in all;
   * nt x nl tiles over axes t and last */
  int t, m;
  int64_t os[IR_MAX_RANK], od[IR_MAX_RANK], ist[IR_MAX_RANK], ost[IR_MAX_RANK];
  int64_t outer, nt, nl;
  /* slice, unslice: start and step of each axis of the full tensor;
   * unslice: xs the operand's strides */
  int64_t start[IR_MAX_RANK], step[IR_MAX_RANK], xs[IR_MAX_RANK];
  /* concat, softmax: the axis; elements after it (inner); concat: rows
   * after it, the last axis excluded (row_inner); gather, gather_grad, topk:
   * the axis, elements after it (inner), elements before it (outer), len
   * the full operand's (gather's x, gather_grad's result, topk's x) length
   * along it */
  int64_t axis, inner, row_inner;
  /* softmax: len along the axis, lines of the axis; cross_entropy: len
   * classes; embedding_grad: len columns, rows of the table */
  int64_t len, lines, rows;
  int64_t n;            /* cross_entropy: rows; mse_loss: elements; embedding_grad: positions;
                           gather, gather_grad: the index's length along the axis; topk: k */
  int64_t ignore_index; /* cross_entropy */
  bool mean;            /* cross_entropy, mse_loss: reduction "mean" */
  KpReduce red;
  /* patches, patches_grad: the geometry (ir_patches_geom); ist the image's
   * strides (pst), cst the patches' strides */
  IrPatches pg;
  int64_t pst[IR_MAX_RANK], cst[IR_MAX_RANK];
} KpLoopPlan;

void kp_loop_plan(const IrOp *op, KpLoopPlan *p);

/* ------------------------------------------------------------------ */
/* kernel_row.c: the plan of a row kernel                              */
/* ------------------------------------------------------------------ */

/* One op of a row kernel in the schedule of passes over the row
 * (kernel_row.c): loop k runs after section k, section k + 1 after loop k. */
typedef struct KpRowStep {
  const IrOp *op;
  KpRowKind kind;
  int y;       /* the result's slot */
  int x[3];    /* operand slots; -1: none, or gathered by index (an embedding's
                  table, an unslice's operand) */
  int pass[3]; /* the loops of its passes over the row, -1 when unused: the
                  statistics (pass 0, 1) and the per-element result (pass 2;
                  pass 0 for elementwise, one_hot, embedding, causal_mask,
                  unslice, or section pass[0] for a per-row elementwise op) */
  int fin[2];  /* the sections finishing its statistics, -1 when unused */
  int at;      /* its result is available from loop (or section) at */
} KpRowStep;

typedef struct KpRowPlan {
  const KpRowLayout *l;
  KpRowStep *steps; /* one per op, in program order */
  int n;
  int *def;         /* by slot: the step that defines it, -1 for an input */
  int *at;          /* by slot: when it is available (0 for an input) */
  bool *konst;      /* by slot: an input that is an inline group-0 const, of value cval */
  double *cval;
} KpRowPlan;

/* Plan the row kernel ops[0..n) laid out as l (arrays in arena a); false
 * when an op is not a row op. */
bool kp_row_plan(const KpRowLayout *l, IrOp *const *ops, int n, Arena *a, KpRowPlan *out);

/* ------------------------------------------------------------------ */
/* kernel_bmm.c: a batch of small products as a generated kernel       */
/* ------------------------------------------------------------------ */
/* A group-0 f32 matmul a BLAS multiplies far below the core's speed runs
 * as a generated kernel on the CPU instead (docs/BACKEND.md "Small and
 * skinny products"): a batch of many small matrices (attention's heads),
 * or one matrix with N or K at most KP_SKINNY (a classifier's logits and
 * their gradients).  C = A B for every batch matrix t in [0, nb), A, B
 * and C read and written through the views GEMMs use (kp_views_find with
 * group-0 ops outside), C += A B where C is a gradient buffer (acc).
 * Element (i, k) of matrix t of A is at element off_a(t) + i am + k ak of
 * the root a (B: (k, n) at bk, bn; C: (i, n) at cm, cn), off_x(t) = xoff +
 * sum over the result's batch axes d of idx_d(t) xs[d] (0 where x
 * broadcasts). */
typedef struct KpBmm {
  const IrValue *a, *b, *c; /* the stored values the views lie in */
  int64_t M, N, K, nb;
  int nbatch; /* the result's batch axes */
  int64_t bdim[IR_MAX_RANK];
  int64_t as[IR_MAX_RANK], bs[IR_MAX_RANK], cs[IR_MAX_RANK];
  int64_t aoff, boff, coff;
  int64_t am, ak, bk, bn, cm, cn;
  bool acc; /* C is (in) a gradient buffer: the product is added to it */
  /* Where the matrices of A and B are known to hold zeros (KP_ZERO_*),
   * as the kernel reads them: its sum over k skips them, whole register
   * tiles at a time (a causal attention's P v, P^T dO, dS k, q^T dS). */
  unsigned azero, bzero;
  /* Where no reader of C needs its matrices (KP_ZERO_*, as the kernel
   * writes C): a causal attention's q k^T, which causal_mask replaces
   * above the diagonal, and dO v^T, which the softmax's backward
   * multiplies by P's zeros there.  The kernel stores zeros in the
   * register tiles that lie wholly there instead of computing them. */
  unsigned cdead;
  /* A single product of at most KP_SKINNY columns with A's rows
   * unit-strided along k (a classifier's logits, h W): each element of C
   * a dot product along K, A's rows read as whole vectors and B's
   * columns as the rows of a panel (B^T). */
  bool dot;
} KpBmm;
#define KP_ZERO_LOWER 1u /* zero where the column index exceeds the row's (a causal softmax) */
#define KP_ZERO_UPPER 2u /* zero where it is below (the transpose of one) */
#define KP_BMM_MAX_MACS 131072  /* multiply-adds per matrix of a batch at most */
#define KP_BMM_MAX_MACS_ZEROS 67108864 /* ... where an operand has known zeros (T 1024, 64 wide heads) */
#define KP_BMM_MAX_PANEL 16384  /* floats of B's packed panel (K x N rounded up to 16) at most */
#define KP_SKINNY 16            /* N or K of a single product at most */
#define KP_BMM_MAX_SMALL_MACS 4194304 /* multiply-adds of a small single product at most (256 x 256 x 64) */
/* Whether the CPU generates op (a matmul) as such a kernel, and its plan:
 * f32 operands and result, B's panel (unless B's rows are whole vectors
 * of 16) at most KP_BMM_MAX_PANEL floats, and either
 *   - a batch of at least two matrices of at most KP_BMM_MAX_MACS
 *     multiply-adds each (KP_BMM_MAX_MACS_ZEROS where A or B has known
 *     zeros: a causal softmax's products, half of whose terms the kernel
 *     skips), C unit-strided along its rows or its columns (then C^T =
 *     B^T A^T is planned: cn 1), or
 *   - a single product (both operands rank 2, or a left operand and a
 *     result of rank >= 3 whose rows fold into one axis each, times a
 *     matrix: x @ W over [B, T, C], planned with M all of their rows)
 *     whose sum runs over at most KP_SKINNY (K: the product is its
 *     stores; not into a gradient buffer, which a GEMM stores first), or
 *     with at most KP_SKINNY columns and A transposed, planned as C^T =
 *     B^T A^T so that the vectors run along M (a classifier's weight
 *     gradient, h^T dlogits: cn is then C's row stride), or
 *   - a small single product summing over more than KP_SKINNY, of at
 *     most KP_BMM_MAX_SMALL_MACS multiply-adds, into a gradient buffer or
 *     not, with A transposed (a weight gradient, x^T dy) or more than
 *     KP_SKINNY columns (x @ W, dy W^T), or
 *   - a single product summing over more than KP_SKINNY into at most
 *     KP_SKINNY columns with A's rows unit-strided along k (logits, h W):
 *     dot products (KpBmm.dot), B^T's panel (N rows of K rounded up to
 *     whole vectors) at most KP_BMM_MAX_PANEL floats, of any size.
 * vs: kp_views_find's views with group-0 ops outside. */
bool kp_bmm_plan(const KpViews *vs, const IrOp *op, KpBmm *out);
/* A dot product's panel row stride (KpBmm.dot): K rounded up to 16 and 16
 * more, so that the rows of B^T read side by side are not a multiple of
 * 4 KB apart. */
int64_t kp_dot_stride(const KpBmm *p);

#endif
