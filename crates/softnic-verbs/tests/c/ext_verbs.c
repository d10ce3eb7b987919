/*
 * ext_verbs.c - single-process loopback test of libibverbs' extended verbs.
 *
 * Written only against <infiniband/verbs.h> (rdma-core v44).  Exercises
 * ibv_query_device_ex, ibv_advise_mr, ibv_create_cq_ex and the
 * start/next/end poll API with the ibv_wc_read_* readers, ibv_create_qp_ex
 * with send_ops_flags and the ibv_wr_* work-request API (batches, inline
 * data, SGE lists, RDMA, atomics, abort, a refused opcode, UD addressing),
 * mixing with the legacy ibv_post_send / ibv_poll_cq, and memory windows
 * (mw_verbs.c: ibv_alloc_mw, ibv_bind_mw, IBV_WR_BIND_MW, IBV_WR_LOCAL_INV,
 * ibv_wr_bind_mw, ibv_wr_send_inv, ibv_wr_local_inv) and ibv_rereg_mr.
 *
 * Expects exactly one usable device with port 1 ACTIVE on Ethernet (RoCE),
 * GID index 1 usable for GRH addressing of the device itself.
 *
 * Build: gcc -O1 -Wall -Wextra -Werror -o ext_verbs ext_verbs.c -libverbs
 *
 * Output: one "ok: <phase>" line per phase, then
 * "ext_verbs: all checks passed" (exit 0).  Any failure prints
 * "FAIL: <what> (<detail>)" to stderr and exits 1.  Every wait is bounded.
 */
#define _POSIX_C_SOURCE 200809L

#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Parameters                                                         */
/* ------------------------------------------------------------------ */

#define PORT            1
#define GID_INDEX       1
#define CQE             256
#define POLL_TIMEOUT_S  10.0  /* bound on every wait for a completion */
#define QUIET_MS        100   /* "nothing arrives" window */
#define UD_QKEY         0x11111111u
#define GRH_LEN         40
#define INLINE_MAX      64    /* max_inline_data requested for RC QPs */

#define QP_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
                   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

#define RC_OPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | \
                IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
                IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

/* Immediate values (host order; converted with htonl/ntohl). */
#define IMM_SEND   0x12345678u
#define IMM_WRITE  0x9abcdef0u
#define IMM_UD     0x0badcafeu

/* Atomic operands (the remote u64 is accessed in host byte order). */
#define FA_INIT    0x1000000000000005ull
#define FA_ADD     0x0000000100000003ull
#define CS_INIT    0xaaaaaaaa55555555ull
#define CS_SWAP    0x0123456789abcdefull
#define CS_SWAP2   0xfedcba9876543210ull

/* Byte value that pre-fills every receive/target area ("untouched"). */
#define UNTOUCHED  0xcd
/* Byte value written over inline sources after the setter returned. */
#define CLOBBER    0xee

/* Sender-side buffer ("A", registered as amr): offsets and lengths. */
#define A_SIZE     0x10000
#define A_SEND     0x0000  /* send: 1000 bytes, seed 1 */
#define A_SGE1     0x1000  /* send_imm, SGE 0: 300 bytes, seed 2 */
#define A_SGE2     0x2000  /* send_imm, SGE 1: 500 bytes, seed 3 */
#define A_WRITE    0x3000  /* rdma_write: 3000 bytes, seed 4 */
#define A_WIMM     0x4000  /* rdma_write_imm: 1500 bytes, seed 5 */
#define A_READ     0x5000  /* rdma_read destination: 3000 bytes */
#define A_ATOM     0x6000  /* 3 x u64 atomic results */
#define A_ABORT    0x7000  /* aborted send: 256 bytes, seed 30 */
#define A_AFTER    0x8000  /* send after the abort: 200 bytes, seed 31 */
#define A_ERR      0x9000  /* error-case sends: 128 bytes, seed 40 */
#define A_UD1      0xa000  /* UD send: 512 bytes, seed 50 */
#define A_UD2      0xb000  /* UD send_imm: 300 bytes, seed 51 */
#define A_MIX1     0xc000  /* mixing, wr API: 700 bytes, seed 60 */
#define A_MIX2     0xd000  /* mixing, legacy post: 900 bytes, seed 61 */

/* Receiver-side buffer ("B", registered as bmr). */
#define B_SIZE     0x10000
#define SLOT       0x1000
#define B_RECV(i)  ((size_t)(i) * SLOT) /* receive slots 0..9 */
#define B_WRITE    0xa000  /* rdma_write target (3000 bytes) */
#define B_WIMM     0xb000  /* rdma_write_imm target (1500 bytes) */
#define B_ATOM     0xc000  /* u64 fetch_add target, u64 cmp_swp target */
#define B_UD1      0xd000  /* UD receive 1 (GRH + 512) */
#define B_UD2      0xe000  /* UD receive 2 (GRH + 300) */

#define LEN_SEND   1000u
#define LEN_SGE1   300u
#define LEN_SGE2   500u
#define LEN_WRITE  3000u
#define LEN_WIMM   1500u
#define LEN_INL    48u
#define LEN_INL_A  20u
#define LEN_INL_B  24u
#define LEN_ABORT  256u
#define LEN_AFTER  200u
#define LEN_ERR    128u
#define LEN_UD1    512u
#define LEN_UD2    300u
#define LEN_MIX1   700u
#define LEN_MIX2   900u

/* ------------------------------------------------------------------ */
/* Failure reporting, time, patterns                                  */
/* ------------------------------------------------------------------ */

__attribute__((format(printf, 1, 2), noreturn))
static void fail(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("FAIL: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* For verbs that return an errno value (0 on success). */
static void check_rc(int rc, const char *what)
{
	if (rc)
		fail("%s (%d: %s)", what, rc, strerror(rc > 0 ? rc : errno));
}

/* For verbs that return NULL and set errno. */
static void *check_ptr(void *p, const char *what)
{
	if (!p)
		fail("%s (errno %d: %s)", what, errno, strerror(errno));
	return p;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Called when a poll found nothing: yield first, then sleep briefly. */
static void backoff(unsigned *idle)
{
	if (++*idle < 2000) {
		sched_yield();
	} else {
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 20000 };

		nanosleep(&ts, NULL);
	}
}

static uint8_t pat(unsigned seed, size_t i)
{
	return (uint8_t)(seed * 37u + i * 13u + (i >> 8) * 7u + 1u);
}

static void fill(void *buf, size_t len, unsigned seed)
{
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = pat(seed, i);
}

static void check_pat(const char *what, const void *buf, size_t len,
		      unsigned seed)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i] != pat(seed, i))
			fail("%s: data mismatch at byte %zu of %zu "
			     "(expected 0x%02x, got 0x%02x)",
			     what, i, len, pat(seed, i), p[i]);
}

static void check_untouched(const char *what, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i] != UNTOUCHED)
			fail("%s: byte %zu was written (0x%02x, expected "
			     "untouched 0x%02x)", what, i, p[i], UNTOUCHED);
}

static uint64_t load_u64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static void store_u64(void *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
}

/* ------------------------------------------------------------------ */
/* Global test state                                                  */
/* ------------------------------------------------------------------ */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;     /* GID at index GID_INDEX of port PORT */
static uint8_t *abuf, *bbuf;
static struct ibv_mr *amr, *bmr;

static uint64_t A(size_t off) { return (uint64_t)(uintptr_t)(abuf + off); }
static uint64_t B(size_t off) { return (uint64_t)(uintptr_t)(bbuf + off); }

/* ------------------------------------------------------------------ */
/* Expected completions and polling                                   */
/* ------------------------------------------------------------------ */

enum imm_check { IMM_ANY = 0, IMM_ABSENT, IMM_EQ };

struct expect {
	const char *what;          /* named when missing or wrong */
	uint64_t wr_id;
	enum ibv_wc_opcode opcode;
	uint32_t qp_num;           /* ibv_wc_read_qp_num must equal this */
	bool check_len;
	uint32_t byte_len;
	enum imm_check imm;
	uint32_t imm_data;         /* host order, for IMM_EQ */
	bool check_src_qp;
	uint32_t src_qp;
	bool want_grh;             /* IBV_WC_GRH must be set */
	bool seen;
};

/* One CQ and the completions it must deliver. */
struct cq_wait {
	const char *name;
	struct ibv_cq_ex *cq;
	struct expect *exp;
	size_t n;
	size_t done;
};

/* What we read out of one completion (whichever poll API was used). */
struct comp {
	enum ibv_wc_opcode opcode;
	uint32_t qp_num;
	uint32_t byte_len;
	unsigned int wc_flags;
	uint32_t imm_data;         /* host order */
	uint32_t src_qp;
};

static struct expect *match(const char *phase, struct cq_wait *w,
			    uint64_t wr_id, enum ibv_wc_status status,
			    uint32_t vendor_err)
{
	struct expect *e = NULL;

	for (size_t i = 0; i < w->n; i++)
		if (!w->exp[i].seen && w->exp[i].wr_id == wr_id) {
			e = &w->exp[i];
			break;
		}
	if (!e)
		fail("%s: unexpected completion on %s (wr_id %" PRIu64
		     ", status %s)", phase, w->name, wr_id,
		     ibv_wc_status_str(status));
	if (status != IBV_WC_SUCCESS)
		fail("%s: %s (wr_id %" PRIu64 ") completed with status %d "
		     "(%s, vendor_err 0x%x)", phase, e->what, wr_id,
		     (int)status, ibv_wc_status_str(status), vendor_err);
	return e;
}

static void verify(const char *phase, struct cq_wait *w, struct expect *e,
		   const struct comp *c)
{
	if (c->opcode != e->opcode)
		fail("%s: %s: opcode %d, expected %d", phase, e->what,
		     (int)c->opcode, (int)e->opcode);
	if (c->qp_num != e->qp_num)
		fail("%s: %s: qp_num 0x%x, expected 0x%x", phase, e->what,
		     c->qp_num, e->qp_num);
	if (e->check_len && c->byte_len != e->byte_len)
		fail("%s: %s: byte_len %u, expected %u", phase, e->what,
		     c->byte_len, e->byte_len);
	if (e->imm == IMM_ABSENT && (c->wc_flags & IBV_WC_WITH_IMM))
		fail("%s: %s: IBV_WC_WITH_IMM set on a completion without "
		     "immediate data (wc_flags 0x%x)", phase, e->what,
		     c->wc_flags);
	if (e->imm == IMM_EQ) {
		if (!(c->wc_flags & IBV_WC_WITH_IMM))
			fail("%s: %s: IBV_WC_WITH_IMM not set (wc_flags 0x%x)",
			     phase, e->what, c->wc_flags);
		if (c->imm_data != e->imm_data)
			fail("%s: %s: imm_data 0x%08x, expected 0x%08x", phase,
			     e->what, c->imm_data, e->imm_data);
	}
	if (e->check_src_qp && (c->src_qp & 0xffffff) != e->src_qp)
		fail("%s: %s: src_qp 0x%x, expected 0x%x", phase, e->what,
		     c->src_qp, e->src_qp);
	if (e->want_grh && !(c->wc_flags & IBV_WC_GRH))
		fail("%s: %s: IBV_WC_GRH not set on a UD receive (wc_flags "
		     "0x%x)", phase, e->what, c->wc_flags);
	e->seen = true;
	w->done++;
}

/* Read the current completion of an extended CQ with the ibv_wc_read_*
 * helpers (only the fields the expectation needs) and check it. */
static void check_current_ex(const char *phase, struct cq_wait *w)
{
	struct ibv_cq_ex *cq = w->cq;
	uint32_t vendor_err = 0;
	struct comp c = { 0 };
	struct expect *e;

	if (cq->status != IBV_WC_SUCCESS)
		vendor_err = ibv_wc_read_vendor_err(cq);
	e = match(phase, w, cq->wr_id, cq->status, vendor_err);

	c.opcode = ibv_wc_read_opcode(cq);
	c.qp_num = ibv_wc_read_qp_num(cq);
	if (e->check_len)
		c.byte_len = ibv_wc_read_byte_len(cq);
	if (e->imm != IMM_ANY || e->want_grh)
		c.wc_flags = ibv_wc_read_wc_flags(cq);
	if (e->imm == IMM_EQ && (c.wc_flags & IBV_WC_WITH_IMM))
		c.imm_data = ntohl(ibv_wc_read_imm_data(cq));
	if (e->check_src_qp)
		c.src_qp = ibv_wc_read_src_qp(cq);
	verify(phase, w, e, &c);
}

/* One ibv_start_poll .. ibv_end_poll batch; returns true if anything
 * was consumed.  Stops once w's expectations are all met (so it never
 * swallows completions meant for a later check). */
static bool drain_ex(const char *phase, struct cq_wait *w)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	int rc;

	rc = ibv_start_poll(w->cq, &attr);
	if (rc == ENOENT)
		return false;           /* no ibv_end_poll after ENOENT */
	if (rc)
		fail("%s: ibv_start_poll on %s (%d: %s)", phase, w->name, rc,
		     strerror(rc));
	for (;;) {
		check_current_ex(phase, w);
		if (w->done == w->n)
			break;
		rc = ibv_next_poll(w->cq);
		if (rc == ENOENT)
			break;
		if (rc) {
			ibv_end_poll(w->cq);
			fail("%s: ibv_next_poll on %s (%d: %s)", phase,
			     w->name, rc, strerror(rc));
		}
	}
	ibv_end_poll(w->cq);
	return true;
}

/* The same with the legacy ibv_poll_cq on ibv_cq_ex_to_cq(cq). */
static bool drain_legacy(const char *phase, struct cq_wait *w)
{
	struct ibv_wc wc[8];
	size_t want = w->n - w->done;
	int got;

	if (want > 8)
		want = 8;
	got = ibv_poll_cq(ibv_cq_ex_to_cq(w->cq), (int)want, wc);
	if (got < 0)
		fail("%s: ibv_poll_cq on %s (%d)", phase, w->name, got);
	for (int i = 0; i < got; i++) {
		struct expect *e = match(phase, w, wc[i].wr_id, wc[i].status,
					 wc[i].vendor_err);
		struct comp c = {
			.opcode = wc[i].opcode,
			.qp_num = wc[i].qp_num,
			.byte_len = wc[i].byte_len,
			.wc_flags = wc[i].wc_flags,
			.imm_data = ntohl(wc[i].imm_data),
			.src_qp = wc[i].src_qp,
		};

		verify(phase, w, e, &c);
	}
	return got > 0;
}

/* Poll all the given CQs round-robin until every expected completion has
 * been seen; on timeout name each missing completion and exit 1. */
static void poll_all(const char *phase, struct cq_wait *w, size_t nw,
		     bool legacy)
{
	double deadline = now_s() + POLL_TIMEOUT_S;
	unsigned idle = 0;

	for (;;) {
		bool pending = false, progress = false;

		for (size_t i = 0; i < nw; i++) {
			if (w[i].done == w[i].n)
				continue;
			progress |= legacy ? drain_legacy(phase, &w[i])
					   : drain_ex(phase, &w[i]);
			if (w[i].done < w[i].n)
				pending = true;
		}
		if (!pending)
			return;
		if (progress) {
			idle = 0;
			continue;
		}
		if (now_s() > deadline) {
			fflush(stdout);
			for (size_t i = 0; i < nw; i++)
				for (size_t j = 0; j < w[i].n; j++)
					if (!w[i].exp[j].seen)
						fprintf(stderr,
							"FAIL: %s: completion missing on %s: %s "
							"(wr_id %" PRIu64 ", timed out after %.0f s)\n",
							phase, w[i].name, w[i].exp[j].what,
							w[i].exp[j].wr_id, POLL_TIMEOUT_S);
			exit(1);
		}
		backoff(&idle);
	}
}

/* Nothing may arrive on any of these CQs for QUIET_MS. */
static void expect_quiet(const char *phase, struct ibv_cq_ex **cqs,
			 const char **names, size_t n)
{
	double deadline = now_s() + QUIET_MS / 1000.0;
	unsigned idle = 0;

	while (now_s() < deadline) {
		for (size_t i = 0; i < n; i++) {
			struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
			int rc = ibv_start_poll(cqs[i], &attr);

			if (rc == ENOENT)
				continue;
			if (rc)
				fail("%s: ibv_start_poll on %s (%d: %s)", phase,
				     names[i], rc, strerror(rc));
			uint64_t wr_id = cqs[i]->wr_id;
			enum ibv_wc_status st = cqs[i]->status;

			ibv_end_poll(cqs[i]);
			fail("%s: unexpected completion on %s (wr_id %" PRIu64
			     ", status %s)", phase, names[i], wr_id,
			     ibv_wc_status_str(st));
		}
		backoff(&idle);
	}
}

/* Shorthands for expectations. */
#define EXP_SEND(what_, id_, op_, qp_) \
	{ .what = (what_), .wr_id = (id_), .opcode = (op_), .qp_num = (qp_)->qp_num }
#define EXP_SEND_LEN(what_, id_, op_, qp_, len_) \
	{ .what = (what_), .wr_id = (id_), .opcode = (op_), .qp_num = (qp_)->qp_num, \
	  .check_len = true, .byte_len = (len_) }
#define EXP_RECV(what_, id_, op_, qp_, len_) \
	{ .what = (what_), .wr_id = (id_), .opcode = (op_), .qp_num = (qp_)->qp_num, \
	  .check_len = true, .byte_len = (len_), .imm = IMM_ABSENT }
#define EXP_RECV_IMM(what_, id_, op_, qp_, len_, imm_) \
	{ .what = (what_), .wr_id = (id_), .opcode = (op_), .qp_num = (qp_)->qp_num, \
	  .check_len = true, .byte_len = (len_), .imm = IMM_EQ, .imm_data = (imm_) }

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------------ */
/* Object helpers                                                     */
/* ------------------------------------------------------------------ */

static struct ibv_cq_ex *create_cq(uint64_t wc_flags, const char *what)
{
	struct ibv_cq_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.cqe = CQE;
	attr.cq_context = NULL;
	attr.channel = NULL;
	attr.comp_vector = 0;
	attr.wc_flags = wc_flags;
	attr.comp_mask = 0;
	return check_ptr(ibv_create_cq_ex(ctx, &attr), what);
}

static struct ibv_qp *create_qp(enum ibv_qp_type type, struct ibv_cq_ex *cq,
				uint64_t send_ops, uint32_t max_inline,
				struct ibv_qp_ex **qpx, const char *what)
{
	struct ibv_qp_init_attr_ex attr;
	struct ibv_qp *qp;
	char buf[128];

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = type;
	attr.send_cq = ibv_cq_ex_to_cq(cq);
	attr.recv_cq = ibv_cq_ex_to_cq(cq);
	attr.cap.max_send_wr = 64;
	attr.cap.max_recv_wr = 64;
	attr.cap.max_send_sge = 4;
	attr.cap.max_recv_sge = 4;
	attr.cap.max_inline_data = max_inline;
	attr.sq_sig_all = 0;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.pd = pd;
	attr.send_ops_flags = send_ops;

	snprintf(buf, sizeof(buf), "ibv_create_qp_ex %s", what);
	qp = check_ptr(ibv_create_qp_ex(ctx, &attr), buf);
	*qpx = ibv_qp_to_qp_ex(qp);
	if (!*qpx)
		fail("ibv_qp_to_qp_ex %s returned NULL", what);
	return qp;
}

static void fill_ah_attr(struct ibv_ah_attr *ah)
{
	memset(ah, 0, sizeof(*ah));
	ah->is_global = 1;
	ah->grh.dgid = gid;
	ah->grh.sgid_index = GID_INDEX;
	ah->grh.hop_limit = 64;
	ah->grh.flow_label = 0;
	ah->grh.traffic_class = 0;
	ah->dlid = 0;
	ah->sl = 0;
	ah->src_path_bits = 0;
	ah->port_num = PORT;
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		   const char *qpname, const char *state)
{
	char buf[128];

	snprintf(buf, sizeof(buf), "ibv_modify_qp %s -> %s", qpname, state);
	check_rc(ibv_modify_qp(qp, attr, mask), buf);
}

static void rc_to_init(struct ibv_qp *qp, const char *name)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT;
	a.qp_access_flags = QP_ACCESS;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		       IBV_QP_ACCESS_FLAGS, name, "INIT");
}

static void rc_to_rtr(struct ibv_qp *qp, uint32_t dest_qpn, const char *name)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	fill_ah_attr(&a.ah_attr);
	modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
		       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       name, "RTR");
}

static void rc_to_rts(struct ibv_qp *qp, const char *name)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		       IBV_QP_MAX_QP_RD_ATOMIC, name, "RTS");
}

/* RESET -> INIT -> RTR -> RTS for both ends, each pointing at the other. */
static void rc_connect(struct ibv_qp *x, const char *xname,
		       struct ibv_qp *y, const char *yname)
{
	rc_to_init(x, xname);
	rc_to_init(y, yname);
	rc_to_rtr(x, y->qp_num, xname);
	rc_to_rtr(y, x->qp_num, yname);
	rc_to_rts(x, xname);
	rc_to_rts(y, yname);
}

static void ud_bring_up(struct ibv_qp *qp, const char *name)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT;
	a.qkey = UD_QKEY;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		       IBV_QP_QKEY, name, "INIT");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	modify(qp, &a, IBV_QP_STATE, name, "RTR");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, name, "RTS");
}

/* Legacy ibv_post_recv of one SGE in the B buffer. */
static void post_recv(struct ibv_qp *qp, uint64_t wr_id, size_t off,
		      uint32_t len, const char *what)
{
	struct ibv_sge sge = { .addr = B(off), .length = len, .lkey = bmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .next = NULL,
				  .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;
	char buf[128];

	snprintf(buf, sizeof(buf), "ibv_post_recv %s", what);
	check_rc(ibv_post_recv(qp, &wr, &bad), buf);
}

static void wr_complete_ok(struct ibv_qp_ex *qpx, const char *what)
{
	char buf[128];

	snprintf(buf, sizeof(buf), "ibv_wr_complete %s", what);
	check_rc(ibv_wr_complete(qpx), buf);
}

/* ------------------------------------------------------------------ */
/* Phases                                                             */
/* ------------------------------------------------------------------ */

static void phase_device(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex attr_ex;
	struct ibv_port_attr pattr;
	const char *name;
	int num = 0;
	int rc;

	list = ibv_get_device_list(&num);
	if (!list)
		fail("ibv_get_device_list (errno %d: %s)", errno,
		     strerror(errno));
	if (num < 1 || !list[0])
		fail("no RDMA device found (%d devices)", num);
	name = ibv_get_device_name(list[0]);
	if (!name)
		fail("ibv_get_device_name returned NULL (errno %d)", errno);
	printf("device: %s\n", name);
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("ibv_open_device %s (errno %d: %s)", name, errno,
		     strerror(errno));
	ibv_free_device_list(list);

	memset(&attr_ex, 0, sizeof(attr_ex));
	rc = ibv_query_device_ex(ctx, NULL, &attr_ex);
	check_rc(rc, "ibv_query_device_ex");
	if (attr_ex.orig_attr.max_qp_wr <= 0)
		fail("ibv_query_device_ex: max_qp_wr %d, expected > 0",
		     attr_ex.orig_attr.max_qp_wr);

	memset(&pattr, 0, sizeof(pattr));
	check_rc(ibv_query_port(ctx, PORT, &pattr), "ibv_query_port 1");
	if (pattr.state != IBV_PORT_ACTIVE)
		fail("port 1 state %d (%s), expected ACTIVE", (int)pattr.state,
		     ibv_port_state_str(pattr.state));
	if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET)
		fail("port 1 link_layer %u, expected ETHERNET (%u)",
		     pattr.link_layer, IBV_LINK_LAYER_ETHERNET);

	check_rc(ibv_query_gid(ctx, PORT, GID_INDEX, &gid),
		 "ibv_query_gid port 1 index 1");
	{
		static const uint8_t zero[16];

		if (!memcmp(gid.raw, zero, sizeof(zero)))
			fail("GID index %d of port 1 is all zeros", GID_INDEX);
	}

	printf("ok: device %s (max_qp_wr %d, max_qp %d, atomic_cap %d, "
	       "port 1 ACTIVE ethernet, active_mtu %d)\n", name,
	       attr_ex.orig_attr.max_qp_wr, attr_ex.orig_attr.max_qp,
	       (int)attr_ex.orig_attr.atomic_cap, (int)pattr.active_mtu);
}

static void phase_memory(void)
{
	void *p;
	int rc;

	pd = check_ptr(ibv_alloc_pd(ctx), "ibv_alloc_pd");

	rc = posix_memalign(&p, 4096, A_SIZE);
	if (rc)
		fail("posix_memalign A (%d: %s)", rc, strerror(rc));
	abuf = p;
	rc = posix_memalign(&p, 4096, B_SIZE);
	if (rc)
		fail("posix_memalign B (%d: %s)", rc, strerror(rc));
	bbuf = p;
	memset(abuf, UNTOUCHED, A_SIZE);
	memset(bbuf, UNTOUCHED, B_SIZE);

	amr = check_ptr(ibv_reg_mr(pd, abuf, A_SIZE, QP_ACCESS), "ibv_reg_mr A");
	bmr = check_ptr(ibv_reg_mr(pd, bbuf, B_SIZE, QP_ACCESS), "ibv_reg_mr B");

	/* ibv_advise_mr returns an errno value: a prefetch of a region's range
	 * succeeds, one past its end is EFAULT (conform.c checks the rest). */
	struct ibv_sge sge = { .addr = A(0), .length = 4096, .lkey = amr->lkey };

	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1);
	if (rc != 0)
		fail("ibv_advise_mr(PREFETCH) returned %d (%s), expected 0",
		     rc, rc > 0 ? strerror(rc) : "?");
	sge.addr = A(A_SIZE - 1024);
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1);
	if (rc != EFAULT)
		fail("ibv_advise_mr(PREFETCH) past the region returned %d, "
		     "expected EFAULT (%d)", rc, EFAULT);
	printf("ok: advise_mr prefetches, EFAULT past the region\n");
}

static void phase_cq_timestamp(void)
{
	struct ibv_cq_init_attr_ex attr;
	struct ibv_cq_ex *cq;

	memset(&attr, 0, sizeof(attr));
	attr.cqe = CQE;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS |
			IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	attr.comp_mask = 0;
	errno = 0;
	cq = ibv_create_cq_ex(ctx, &attr);
	if (cq) {
		check_rc(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)),
			 "ibv_destroy_cq (timestamp CQ)");
		printf("ok: create_cq_ex with COMPLETION_TIMESTAMP supported\n");
	} else if (errno == EOPNOTSUPP) {
		printf("ok: create_cq_ex with COMPLETION_TIMESTAMP -> "
		       "EOPNOTSUPP\n");
	} else {
		fail("ibv_create_cq_ex with COMPLETION_TIMESTAMP: errno %d "
		     "(%s), expected success or EOPNOTSUPP", errno,
		     strerror(errno));
	}
}

/* RC pair used by phases 4, 5 and 8. */
static struct ibv_cq_ex *cq_a, *cq_b;
static struct ibv_qp *qa, *qb;
static struct ibv_qp_ex *ax, *bx;

static void phase_rc_setup(void)
{
	cq_a = create_cq(IBV_WC_STANDARD_FLAGS, "ibv_create_cq_ex A");
	cq_b = create_cq(IBV_WC_STANDARD_FLAGS, "ibv_create_cq_ex B");
	qa = create_qp(IBV_QPT_RC, cq_a, RC_OPS, INLINE_MAX, &ax, "RC A");
	qb = create_qp(IBV_QPT_RC, cq_b, RC_OPS, INLINE_MAX, &bx, "RC B");
	rc_connect(qa, "RC A", qb, "RC B");
	printf("ok: rc connect (qpn A 0x%x <-> B 0x%x)\n", qa->qp_num,
	       qb->qp_num);
}

static void phase_rc_batch(void)
{
	static const char *phase = "rc batch";
	uint8_t *inl, *inl_a, *inl_b;

	fill(abuf + A_SEND, LEN_SEND, 1);
	fill(abuf + A_SGE1, LEN_SGE1, 2);
	fill(abuf + A_SGE2, LEN_SGE2, 3);
	fill(abuf + A_WRITE, LEN_WRITE, 4);
	fill(abuf + A_WIMM, LEN_WIMM, 5);
	memset(bbuf + B_WRITE, UNTOUCHED, SLOT);
	memset(bbuf + B_WIMM, UNTOUCHED, SLOT);

	/* Inline sources live outside any MR. */
	inl = check_ptr(malloc(LEN_INL), "malloc inline");
	inl_a = check_ptr(malloc(LEN_INL_A), "malloc inline a");
	inl_b = check_ptr(malloc(LEN_INL_B), "malloc inline b");
	fill(inl, LEN_INL, 6);
	fill(inl_a, LEN_INL_A, 7);
	fill(inl_b, LEN_INL_B, 8);

	/* Receives for: send, send_imm, write_imm, inline, inline list. */
	for (unsigned i = 0; i < 5; i++)
		post_recv(qb, 101 + i, B_RECV(i), SLOT, "RC B");

	ibv_wr_start(ax);

	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_sge(ax, amr->lkey, A(A_SEND), LEN_SEND);

	struct ibv_sge sgl[2] = {
		{ .addr = A(A_SGE1), .length = LEN_SGE1, .lkey = amr->lkey },
		{ .addr = A(A_SGE2), .length = LEN_SGE2, .lkey = amr->lkey },
	};
	ax->wr_id = 2;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(ax, htonl(IMM_SEND));
	ibv_wr_set_sge_list(ax, 2, sgl);

	ax->wr_id = 3;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ax, bmr->rkey, B(B_WRITE));
	ibv_wr_set_sge(ax, amr->lkey, A(A_WRITE), LEN_WRITE);

	ax->wr_id = 4;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(ax, bmr->rkey, B(B_WIMM), htonl(IMM_WRITE));
	ibv_wr_set_sge(ax, amr->lkey, A(A_WIMM), LEN_WIMM);

	ax->wr_id = 5;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_inline_data(ax, inl, LEN_INL);
	memset(inl, CLOBBER, LEN_INL);  /* inline: source reusable at once */

	struct ibv_data_buf dbl[2] = {
		{ .addr = inl_a, .length = LEN_INL_A },
		{ .addr = inl_b, .length = LEN_INL_B },
	};
	ax->wr_id = 6;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_inline_data_list(ax, 2, dbl);
	memset(inl_a, CLOBBER, LEN_INL_A);
	memset(inl_b, CLOBBER, LEN_INL_B);

	wr_complete_ok(ax, "rc batch");

	struct expect ea[] = {
		EXP_SEND("send", 1, IBV_WC_SEND, qa),
		EXP_SEND("send_imm (2 SGEs)", 2, IBV_WC_SEND, qa),
		EXP_SEND("rdma_write", 3, IBV_WC_RDMA_WRITE, qa),
		EXP_SEND("rdma_write_imm", 4, IBV_WC_RDMA_WRITE, qa),
		EXP_SEND("inline send", 5, IBV_WC_SEND, qa),
		EXP_SEND("inline-list send", 6, IBV_WC_SEND, qa),
	};
	struct expect eb[] = {
		EXP_RECV("recv of send", 101, IBV_WC_RECV, qb, LEN_SEND),
		EXP_RECV_IMM("recv of send_imm", 102, IBV_WC_RECV, qb,
			     LEN_SGE1 + LEN_SGE2, IMM_SEND),
		EXP_RECV_IMM("recv of rdma_write_imm", 103,
			     IBV_WC_RECV_RDMA_WITH_IMM, qb, LEN_WIMM, IMM_WRITE),
		EXP_RECV("recv of inline send", 104, IBV_WC_RECV, qb, LEN_INL),
		EXP_RECV("recv of inline-list send", 105, IBV_WC_RECV, qb,
			 LEN_INL_A + LEN_INL_B),
	};
	struct cq_wait w[] = {
		{ .name = "CQ B (receiver)", .cq = cq_b, .exp = eb, .n = NELEM(eb) },
		{ .name = "CQ A (sender)", .cq = cq_a, .exp = ea, .n = NELEM(ea) },
	};
	poll_all(phase, w, NELEM(w), false);

	/* Data. */
	check_pat("rc batch: send payload", bbuf + B_RECV(0), LEN_SEND, 1);
	check_untouched("rc batch: past send payload", bbuf + B_RECV(0) + LEN_SEND,
			SLOT - LEN_SEND);
	check_pat("rc batch: send_imm SGE 0", bbuf + B_RECV(1), LEN_SGE1, 2);
	check_pat("rc batch: send_imm SGE 1", bbuf + B_RECV(1) + LEN_SGE1,
		  LEN_SGE2, 3);
	check_untouched("rc batch: past send_imm payload",
			bbuf + B_RECV(1) + LEN_SGE1 + LEN_SGE2,
			SLOT - LEN_SGE1 - LEN_SGE2);
	check_untouched("rc batch: receive buffer of rdma_write_imm",
			bbuf + B_RECV(2), SLOT);
	check_pat("rc batch: rdma_write target", bbuf + B_WRITE, LEN_WRITE, 4);
	check_untouched("rc batch: past rdma_write target",
			bbuf + B_WRITE + LEN_WRITE, SLOT - LEN_WRITE);
	check_pat("rc batch: rdma_write_imm target", bbuf + B_WIMM, LEN_WIMM, 5);
	check_untouched("rc batch: past rdma_write_imm target",
			bbuf + B_WIMM + LEN_WIMM, SLOT - LEN_WIMM);
	check_pat("rc batch: inline send payload (source was overwritten "
		  "before ibv_wr_complete)", bbuf + B_RECV(3), LEN_INL, 6);
	check_untouched("rc batch: past inline payload",
			bbuf + B_RECV(3) + LEN_INL, SLOT - LEN_INL);
	check_pat("rc batch: inline-list buffer 0", bbuf + B_RECV(4),
		  LEN_INL_A, 7);
	check_pat("rc batch: inline-list buffer 1",
		  bbuf + B_RECV(4) + LEN_INL_A, LEN_INL_B, 8);
	check_untouched("rc batch: past inline-list payload",
			bbuf + B_RECV(4) + LEN_INL_A + LEN_INL_B,
			SLOT - LEN_INL_A - LEN_INL_B);

	free(inl);
	free(inl_a);
	free(inl_b);
	printf("ok: rc batch (send, send_imm+sge_list, rdma_write, "
	       "rdma_write_imm, inline, inline list)\n");
}

static void phase_rc_read_atomic(void)
{
	static const char *phase = "rc read/atomic batch";

	memset(abuf + A_READ, UNTOUCHED, SLOT);
	memset(abuf + A_ATOM, UNTOUCHED, SLOT);
	store_u64(bbuf + B_ATOM, FA_INIT);
	store_u64(bbuf + B_ATOM + 8, CS_INIT);

	ibv_wr_start(ax);

	ax->wr_id = 11;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(ax, bmr->rkey, B(B_WRITE));
	ibv_wr_set_sge(ax, amr->lkey, A(A_READ), LEN_WRITE);

	ax->wr_id = 12;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(ax, bmr->rkey, B(B_ATOM), FA_ADD);
	ibv_wr_set_sge(ax, amr->lkey, A(A_ATOM), 8);

	ax->wr_id = 13;       /* compare matches: swaps */
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(ax, bmr->rkey, B(B_ATOM + 8), CS_INIT, CS_SWAP);
	ibv_wr_set_sge(ax, amr->lkey, A(A_ATOM + 8), 8);

	ax->wr_id = 14;       /* compare is now stale: no swap */
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(ax, bmr->rkey, B(B_ATOM + 8), CS_INIT, CS_SWAP2);
	ibv_wr_set_sge(ax, amr->lkey, A(A_ATOM + 16), 8);

	wr_complete_ok(ax, "rc read/atomic batch");

	struct expect ea[] = {
		EXP_SEND_LEN("rdma_read", 11, IBV_WC_RDMA_READ, qa, LEN_WRITE),
		EXP_SEND_LEN("atomic_fetch_add", 12, IBV_WC_FETCH_ADD, qa, 8),
		EXP_SEND_LEN("atomic_cmp_swp (match)", 13, IBV_WC_COMP_SWAP, qa, 8),
		EXP_SEND_LEN("atomic_cmp_swp (mismatch)", 14, IBV_WC_COMP_SWAP,
			     qa, 8),
	};
	struct cq_wait w[] = {
		{ .name = "CQ A (sender)", .cq = cq_a, .exp = ea, .n = NELEM(ea) },
	};
	poll_all(phase, w, NELEM(w), false);

	check_pat("rc read: data read back", abuf + A_READ, LEN_WRITE, 4);
	check_untouched("rc read: past read buffer", abuf + A_READ + LEN_WRITE,
			SLOT - LEN_WRITE);

	uint64_t v;

	if ((v = load_u64(abuf + A_ATOM)) != FA_INIT)
		fail("fetch_add returned 0x%016" PRIx64 ", expected original "
		     "0x%016" PRIx64, v, (uint64_t)FA_INIT);
	if ((v = load_u64(bbuf + B_ATOM)) != FA_INIT + FA_ADD)
		fail("fetch_add: remote is 0x%016" PRIx64 ", expected 0x%016"
		     PRIx64, v, (uint64_t)(FA_INIT + FA_ADD));
	if ((v = load_u64(abuf + A_ATOM + 8)) != CS_INIT)
		fail("cmp_swp (match) returned 0x%016" PRIx64 ", expected "
		     "0x%016" PRIx64, v, (uint64_t)CS_INIT);
	if ((v = load_u64(abuf + A_ATOM + 16)) != CS_SWAP)
		fail("cmp_swp (mismatch) returned 0x%016" PRIx64 ", expected "
		     "0x%016" PRIx64, v, (uint64_t)CS_SWAP);
	if ((v = load_u64(bbuf + B_ATOM + 8)) != CS_SWAP)
		fail("cmp_swp: remote is 0x%016" PRIx64 ", expected swapped "
		     "value 0x%016" PRIx64 " (second, stale compare must not "
		     "swap)", v, (uint64_t)CS_SWAP);
	check_untouched("atomics: past result buffers", abuf + A_ATOM + 24,
			SLOT - 24);

	struct ibv_cq_ex *cqs[] = { cq_b };
	const char *names[] = { "CQ B (receiver)" };

	expect_quiet(phase, cqs, names, 1);
	printf("ok: rc read/atomic batch (rdma_read, fetch_add, cmp_swp x2)\n");
}

static void phase_abort(void)
{
	static const char *phase = "wr_abort";

	fill(abuf + A_ABORT, LEN_ABORT, 30);
	fill(abuf + A_AFTER, LEN_AFTER, 31);
	post_recv(qb, 201, B_RECV(5), SLOT, "RC B (abort)");

	ibv_wr_start(ax);
	ax->wr_id = 301;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_sge(ax, amr->lkey, A(A_ABORT), LEN_ABORT);
	ibv_wr_abort(ax);

	ibv_wr_start(ax);
	ax->wr_id = 302;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_sge(ax, amr->lkey, A(A_AFTER), LEN_AFTER);
	wr_complete_ok(ax, "send after abort");

	struct expect ea[] = {
		EXP_SEND("send after abort (the aborted wr_id 301 must never "
			 "complete)", 302, IBV_WC_SEND, qa),
	};
	struct expect eb[] = {
		EXP_RECV("recv of the send after abort (byte_len 256 would be "
			 "the aborted send)", 201, IBV_WC_RECV, qb, LEN_AFTER),
	};
	struct cq_wait w[] = {
		{ .name = "CQ B (receiver)", .cq = cq_b, .exp = eb, .n = NELEM(eb) },
		{ .name = "CQ A (sender)", .cq = cq_a, .exp = ea, .n = NELEM(ea) },
	};
	poll_all(phase, w, NELEM(w), false);

	check_pat("wr_abort: payload after abort", bbuf + B_RECV(5), LEN_AFTER,
		  31);
	check_untouched("wr_abort: past payload", bbuf + B_RECV(5) + LEN_AFTER,
			SLOT - LEN_AFTER);

	struct ibv_cq_ex *cqs[] = { cq_a, cq_b };
	const char *names[] = { "CQ A (sender)", "CQ B (receiver)" };

	expect_quiet(phase, cqs, names, 2);
	printf("ok: wr_abort (aborted send never arrived)\n");
}

/* QPs C (SEND only) and D for the refused-opcode case. */
static struct ibv_cq_ex *cq_c, *cq_d;
static struct ibv_qp *qc, *qd;
static struct ibv_qp_ex *cx, *dx;

static void phase_error(void)
{
	static const char *phase = "error case";
	int rc;

	cq_c = create_cq(IBV_WC_STANDARD_FLAGS, "ibv_create_cq_ex C");
	cq_d = create_cq(IBV_WC_STANDARD_FLAGS, "ibv_create_cq_ex D");
	qc = create_qp(IBV_QPT_RC, cq_c, IBV_QP_EX_WITH_SEND, 0, &cx,
		       "RC C (SEND only)");
	qd = create_qp(IBV_QPT_RC, cq_d, IBV_QP_EX_WITH_SEND, 0, &dx,
		       "RC D (SEND only)");
	rc_connect(qc, "RC C", qd, "RC D");

	fill(abuf + A_ERR, LEN_ERR, 40);
	memset(bbuf + B_RECV(6), UNTOUCHED, SLOT);
	post_recv(qd, 601, B_RECV(6), SLOT, "RC D");

	if (!cx->wr_rdma_write)
		fail("error case: QP created without IBV_QP_EX_WITH_RDMA_WRITE "
		     "has a NULL wr_rdma_write builder (expected a builder "
		     "whose WR makes ibv_wr_complete fail)");

	/* A valid send, then an RDMA write the QP was not created for:
	 * ibv_wr_complete must fail and post nothing at all. */
	ibv_wr_start(cx);
	cx->wr_id = 611;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, amr->lkey, A(A_ERR), LEN_ERR);
	cx->wr_id = 612;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(cx, bmr->rkey, B(B_WRITE));
	ibv_wr_set_sge(cx, amr->lkey, A(A_ERR), LEN_ERR);
	rc = ibv_wr_complete(cx);
	if (rc == 0)
		fail("error case: ibv_wr_complete accepted an RDMA write on a "
		     "QP created with send_ops_flags = SEND only (returned 0)");
	printf("error case: ibv_wr_complete -> %d (%s)\n", rc,
	       rc > 0 ? strerror(rc) : "negative");

	struct ibv_cq_ex *cqs[] = { cq_c, cq_d };
	const char *names[] = { "CQ C (sender)", "CQ D (receiver)" };

	expect_quiet(phase, cqs, names, 2);
	check_untouched("error case: receive buffer on D", bbuf + B_RECV(6),
			SLOT);

	/* The failed batch was discarded as a whole; the QP still works. */
	ibv_wr_start(cx);
	cx->wr_id = 613;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, amr->lkey, A(A_ERR), LEN_ERR);
	wr_complete_ok(cx, "send after the failed batch");

	struct expect ec[] = {
		EXP_SEND("send after the failed batch", 613, IBV_WC_SEND, qc),
	};
	struct expect ed[] = {
		EXP_RECV("recv of the send after the failed batch", 601,
			 IBV_WC_RECV, qd, LEN_ERR),
	};
	struct cq_wait w[] = {
		{ .name = "CQ D (receiver)", .cq = cq_d, .exp = ed, .n = NELEM(ed) },
		{ .name = "CQ C (sender)", .cq = cq_c, .exp = ec, .n = NELEM(ec) },
	};
	poll_all(phase, w, NELEM(w), false);
	check_pat("error case: payload after the failed batch",
		  bbuf + B_RECV(6), LEN_ERR, 40);

	printf("ok: error case (opcode outside send_ops_flags refused by "
	       "ibv_wr_complete: %d, nothing posted)\n", rc);
}

/* UD pair. */
static struct ibv_cq_ex *cq_ua, *cq_ub;
static struct ibv_qp *ua, *ub;
static struct ibv_qp_ex *uax, *ubx;
static struct ibv_ah *ah;

static void phase_ud(void)
{
	static const char *phase = "ud batch";
	const uint64_t ud_wc = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
			       IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP;
	struct ibv_ah_attr ah_attr;

	cq_ua = create_cq(ud_wc, "ibv_create_cq_ex UD A");
	cq_ub = create_cq(ud_wc, "ibv_create_cq_ex UD B");
	ua = create_qp(IBV_QPT_UD, cq_ua,
		       IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 0,
		       &uax, "UD A");
	ub = create_qp(IBV_QPT_UD, cq_ub,
		       IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 0,
		       &ubx, "UD B");
	ud_bring_up(ua, "UD A");
	ud_bring_up(ub, "UD B");

	fill_ah_attr(&ah_attr);
	ah = check_ptr(ibv_create_ah(pd, &ah_attr), "ibv_create_ah");

	fill(abuf + A_UD1, LEN_UD1, 50);
	fill(abuf + A_UD2, LEN_UD2, 51);
	memset(bbuf + B_UD1, UNTOUCHED, SLOT);
	memset(bbuf + B_UD2, UNTOUCHED, SLOT);
	post_recv(ub, 701, B_UD1, GRH_LEN + LEN_UD1, "UD B 1");
	post_recv(ub, 702, B_UD2, GRH_LEN + LEN_UD2, "UD B 2");

	ibv_wr_start(uax);

	uax->wr_id = 71;
	uax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(uax);
	ibv_wr_set_ud_addr(uax, ah, ub->qp_num, UD_QKEY);
	ibv_wr_set_sge(uax, amr->lkey, A(A_UD1), LEN_UD1);

	uax->wr_id = 72;
	uax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(uax, htonl(IMM_UD));
	ibv_wr_set_ud_addr(uax, ah, ub->qp_num, UD_QKEY);
	ibv_wr_set_sge(uax, amr->lkey, A(A_UD2), LEN_UD2);

	wr_complete_ok(uax, "ud batch");

	struct expect ea[] = {
		EXP_SEND("ud send", 71, IBV_WC_SEND, ua),
		EXP_SEND("ud send_imm", 72, IBV_WC_SEND, ua),
	};
	struct expect eb[] = {
		{ .what = "ud recv of send", .wr_id = 701, .opcode = IBV_WC_RECV,
		  .qp_num = ub->qp_num, .check_len = true,
		  .byte_len = GRH_LEN + LEN_UD1, .imm = IMM_ABSENT,
		  .check_src_qp = true, .src_qp = ua->qp_num, .want_grh = true },
		{ .what = "ud recv of send_imm", .wr_id = 702,
		  .opcode = IBV_WC_RECV, .qp_num = ub->qp_num,
		  .check_len = true, .byte_len = GRH_LEN + LEN_UD2,
		  .imm = IMM_EQ, .imm_data = IMM_UD,
		  .check_src_qp = true, .src_qp = ua->qp_num, .want_grh = true },
	};
	struct cq_wait w[] = {
		{ .name = "CQ UD B (receiver)", .cq = cq_ub, .exp = eb, .n = NELEM(eb) },
		{ .name = "CQ UD A (sender)", .cq = cq_ua, .exp = ea, .n = NELEM(ea) },
	};
	poll_all(phase, w, NELEM(w), false);

	check_pat("ud: payload after the GRH (send)", bbuf + B_UD1 + GRH_LEN,
		  LEN_UD1, 50);
	check_untouched("ud: past receive buffer 1",
			bbuf + B_UD1 + GRH_LEN + LEN_UD1,
			SLOT - GRH_LEN - LEN_UD1);
	check_pat("ud: payload after the GRH (send_imm)",
		  bbuf + B_UD2 + GRH_LEN, LEN_UD2, 51);
	check_untouched("ud: past receive buffer 2",
			bbuf + B_UD2 + GRH_LEN + LEN_UD2,
			SLOT - GRH_LEN - LEN_UD2);
	printf("ok: ud batch (send + send_imm with set_ud_addr, src_qp 0x%x)\n",
	       ua->qp_num);
}

static void phase_mixing(void)
{
	static const char *phase = "legacy poll";

	fill(abuf + A_MIX1, LEN_MIX1, 60);
	fill(abuf + A_MIX2, LEN_MIX2, 61);
	memset(bbuf + B_RECV(7), UNTOUCHED, 2 * SLOT);
	post_recv(qb, 801, B_RECV(7), SLOT, "RC B (mix 1)");
	post_recv(qb, 802, B_RECV(8), SLOT, "RC B (mix 2)");

	/* One WR through the wr API ... */
	ibv_wr_start(ax);
	ax->wr_id = 81;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(ax, htonl(IMM_SEND));
	ibv_wr_set_sge(ax, amr->lkey, A(A_MIX1), LEN_MIX1);
	wr_complete_ok(ax, "mixing batch");

	/* ... and one through the legacy ibv_post_send on the same QP. */
	struct ibv_sge sge = { .addr = A(A_MIX2), .length = LEN_MIX2,
			       .lkey = amr->lkey };
	struct ibv_send_wr wr = { .wr_id = 82, .next = NULL, .sg_list = &sge,
				  .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad = NULL;

	check_rc(ibv_post_send(qa, &wr, &bad), "ibv_post_send (mixing)");

	struct expect ea[] = {
		EXP_SEND("wr-API send_imm", 81, IBV_WC_SEND, qa),
		EXP_SEND("legacy ibv_post_send send", 82, IBV_WC_SEND, qa),
	};
	struct expect eb[] = {
		EXP_RECV_IMM("recv of wr-API send_imm", 801, IBV_WC_RECV, qb,
			     LEN_MIX1, IMM_SEND),
		EXP_RECV("recv of legacy send", 802, IBV_WC_RECV, qb, LEN_MIX2),
	};
	struct cq_wait w[] = {
		{ .name = "CQ B (receiver, ibv_poll_cq)", .cq = cq_b, .exp = eb,
		  .n = NELEM(eb) },
		{ .name = "CQ A (sender, ibv_poll_cq)", .cq = cq_a, .exp = ea,
		  .n = NELEM(ea) },
	};
	poll_all(phase, w, NELEM(w), true);

	check_pat("mixing: wr-API payload", bbuf + B_RECV(7), LEN_MIX1, 60);
	check_untouched("mixing: past wr-API payload",
			bbuf + B_RECV(7) + LEN_MIX1, SLOT - LEN_MIX1);
	check_pat("mixing: legacy payload", bbuf + B_RECV(8), LEN_MIX2, 61);
	check_untouched("mixing: past legacy payload",
			bbuf + B_RECV(8) + LEN_MIX2, SLOT - LEN_MIX2);
	printf("ok: legacy ibv_poll_cq on extended CQs (wr API and "
	       "ibv_post_send mixed on one QP)\n");
}

static void destroy_qp(struct ibv_qp *qp, const char *what)
{
	char buf[128];

	snprintf(buf, sizeof(buf), "ibv_destroy_qp %s", what);
	check_rc(ibv_destroy_qp(qp), buf);
}

static void destroy_cq(struct ibv_cq_ex *cq, const char *what)
{
	char buf[128];

	snprintf(buf, sizeof(buf), "ibv_destroy_cq %s", what);
	check_rc(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), buf);
}

static void phase_cleanup(void)
{
	check_rc(ibv_destroy_ah(ah), "ibv_destroy_ah");
	destroy_qp(qa, "RC A");
	destroy_qp(qb, "RC B");
	destroy_qp(qc, "RC C");
	destroy_qp(qd, "RC D");
	destroy_qp(ua, "UD A");
	destroy_qp(ub, "UD B");
	destroy_cq(cq_a, "A");
	destroy_cq(cq_b, "B");
	destroy_cq(cq_c, "C");
	destroy_cq(cq_d, "D");
	destroy_cq(cq_ua, "UD A");
	destroy_cq(cq_ub, "UD B");
	check_rc(ibv_dereg_mr(amr), "ibv_dereg_mr A");
	check_rc(ibv_dereg_mr(bmr), "ibv_dereg_mr B");
	check_rc(ibv_dealloc_pd(pd), "ibv_dealloc_pd");
	check_rc(ibv_close_device(ctx), "ibv_close_device");
	free(abuf);
	free(bbuf);
	printf("ok: cleanup\n");
}

/* The memory-window phase: ibv_alloc_mw, ibv_bind_mw, the bind and
 * invalidate work requests, ibv_rereg_mr. */
#include "mw_verbs.c"

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);

	phase_device();
	phase_memory();
	phase_cq_timestamp();
	phase_rc_setup();
	phase_rc_batch();
	phase_rc_read_atomic();
	phase_abort();
	phase_error();
	phase_ud();
	phase_mixing();
	phase_windows();
	phase_cleanup();

	printf("ext_verbs: all checks passed\n");
	return 0;
}
