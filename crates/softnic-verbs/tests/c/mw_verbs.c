/*
 * mw_verbs.c - the memory-window phase of ext_verbs.c (included by it, after
 * its helpers: fail, check_rc, check_ptr, now_s, backoff, create_cq,
 * create_qp, rc_connect, ctx and pd).
 *
 * Uses rdma-core's own inlines, as any program does: ibv_alloc_mw,
 * ibv_bind_mw (type 1), ibv_post_send with IBV_WR_BIND_MW, IBV_WR_LOCAL_INV
 * and IBV_WR_SEND_WITH_INV, ibv_wr_bind_mw, ibv_wr_local_inv and
 * ibv_wr_send_inv, ibv_dealloc_mw, and ibv_rereg_mr. One RC pair on one
 * device: M1 reaches memory through windows M2 binds.
 */

#define MW_OPS (RC_OPS | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | \
		IBV_QP_EX_WITH_SEND_WITH_INV)
#define MW_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND)
#define MW_BUF    8192
#define MW_LEN    512

static struct ibv_cq *mcq;

/* The next completion of the phase's CQ, within POLL_TIMEOUT_S. */
static struct ibv_wc mw_wait(const char *what)
{
	double deadline = now_s() + POLL_TIMEOUT_S;
	unsigned idle = 0;
	struct ibv_wc wc;

	for (;;) {
		int n = ibv_poll_cq(mcq, 1, &wc);

		if (n < 0)
			fail("windows: ibv_poll_cq for %s returned %d", what, n);
		if (n == 1)
			return wc;
		if (now_s() > deadline)
			fail("windows: no completion for %s after %.0f s", what,
			     POLL_TIMEOUT_S);
		backoff(&idle);
	}
}

/* The next completion must be `wr_id` with `status` and (on success) `op`. */
static struct ibv_wc mw_expect(const char *what, uint64_t wr_id,
			       enum ibv_wc_status status, enum ibv_wc_opcode op)
{
	struct ibv_wc wc = mw_wait(what);

	if (wc.wr_id != wr_id || wc.status != status ||
	    (status == IBV_WC_SUCCESS && wc.opcode != op))
		fail("windows: %s: wr_id %" PRIu64 " status %s opcode %d, "
		     "expected wr_id %" PRIu64 " status %s opcode %d", what,
		     wc.wr_id, ibv_wc_status_str(wc.status), (int)wc.opcode,
		     wr_id, ibv_wc_status_str(status), (int)op);
	return wc;
}

static void mw_post(struct ibv_qp *qp, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad = NULL;

	check_rc(ibv_post_send(qp, wr, &bad), what);
}

/* A signaled RDMA WRITE of `len` bytes of `src` to `addr` under `rkey`. */
static void mw_write(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *smr,
		     const uint8_t *src, uint32_t len, uint64_t addr,
		     uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len,
			       .lkey = smr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED };

	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	mw_post(qp, &wr, "ibv_post_send RDMA WRITE through a window");
}

static void phase_windows(void)
{
	struct ibv_device_attr attr;
	struct ibv_qp *m1, *m2;
	struct ibv_qp_ex *m1x, *m2x;
	struct ibv_cq_ex *cq;
	struct ibv_mr *wmr, *smr;
	struct ibv_mw *mw1, *mw2;
	struct ibv_wc wc;
	uint8_t *win, *src;
	uint32_t old, key;

	check_rc(ibv_query_device(ctx, &attr), "ibv_query_device");
	if (attr.max_mw <= 0 ||
	    !(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) ||
	    !(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B))
		fail("windows: max_mw %d, device_cap_flags 0x%x: no type 1 "
		     "and 2B windows", attr.max_mw, attr.device_cap_flags);

	cq = create_cq(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
		       "windows");
	mcq = ibv_cq_ex_to_cq(cq);
	m1 = create_qp(IBV_QPT_RC, cq, MW_OPS, 0, &m1x, "windows M1");
	m2 = create_qp(IBV_QPT_RC, cq, MW_OPS, 0, &m2x, "windows M2");
	rc_connect(m1, "windows M1", m2, "windows M2");
	win = check_ptr(calloc(1, MW_BUF), "calloc windows");
	src = check_ptr(malloc(MW_BUF), "malloc windows source");
	memset(win, UNTOUCHED, MW_BUF);
	fill(src, MW_BUF, 70);
	wmr = check_ptr(ibv_reg_mr(pd, win, MW_BUF, MW_ACCESS),
			"ibv_reg_mr windows");
	smr = check_ptr(ibv_reg_mr(pd, src, MW_BUF, IBV_ACCESS_LOCAL_WRITE),
			"ibv_reg_mr windows source");

	/* Type 1: ibv_bind_mw, which posts a bind on M2's send queue. */
	mw1 = check_ptr(ibv_alloc_mw(pd, IBV_MW_TYPE_1), "ibv_alloc_mw type 1");
	old = mw1->rkey;
	struct ibv_mw_bind b1 = {
		.wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = wmr, .addr = (uintptr_t)win,
			       .length = MW_LEN,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
	};
	check_rc(ibv_bind_mw(m2, mw1, &b1), "ibv_bind_mw type 1");
	if (mw1->rkey != ibv_inc_rkey(old))
		fail("windows: ibv_bind_mw left rkey 0x%x (was 0x%x)",
		     mw1->rkey, old);
	mw_expect("ibv_bind_mw", 1, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	mw_write(m1, 2, smr, src, MW_LEN, (uintptr_t)win, mw1->rkey);
	mw_expect("WRITE through a type 1 window", 2, IBV_WC_SUCCESS,
		  IBV_WC_RDMA_WRITE);
	check_pat("windows: type 1 WRITE", win, MW_LEN, 70);
	if (ibv_dereg_mr(wmr) != EINVAL)
		fail("windows: ibv_dereg_mr of a region with a bound window "
		     "did not fail with EINVAL");
	check_rc(ibv_dealloc_mw(mw1), "ibv_dealloc_mw type 1");

	/* Type 2: IBV_WR_BIND_MW by ibv_post_send, then IBV_WR_LOCAL_INV. */
	mw2 = check_ptr(ibv_alloc_mw(pd, IBV_MW_TYPE_2), "ibv_alloc_mw type 2");
	key = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bind = { .wr_id = 3, .opcode = IBV_WR_BIND_MW,
				    .send_flags = IBV_SEND_SIGNALED };
	bind.bind_mw.mw = mw2;
	bind.bind_mw.rkey = key;
	bind.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = wmr, .addr = (uintptr_t)win + 1024, .length = MW_LEN,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	mw_post(m2, &bind, "ibv_post_send IBV_WR_BIND_MW");
	mw_expect("IBV_WR_BIND_MW", 3, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	mw_write(m1, 4, smr, src, MW_LEN, (uintptr_t)win + 1024, key);
	mw_expect("WRITE through a type 2 window", 4, IBV_WC_SUCCESS,
		  IBV_WC_RDMA_WRITE);
	check_pat("windows: type 2 WRITE", win + 1024, MW_LEN, 70);
	struct ibv_send_wr inv = { .wr_id = 5, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = key;
	mw_post(m2, &inv, "ibv_post_send IBV_WR_LOCAL_INV");
	mw_expect("IBV_WR_LOCAL_INV", 5, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);

	/* Bound again with ibv_wr_bind_mw; the peer's ibv_wr_send_inv frees it. */
	key = ibv_inc_rkey(key);
	struct ibv_mw_bind_info bi = {
		.mr = wmr, .addr = (uintptr_t)win + 2048, .length = MW_LEN,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(m2x);
	m2x->wr_id = 6;
	m2x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(m2x, mw2, key, &bi);
	wr_complete_ok(m2x, "ibv_wr_bind_mw");
	mw_expect("ibv_wr_bind_mw", 6, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	struct ibv_sge rsge = { .addr = (uintptr_t)win + 4096, .length = 64,
				.lkey = wmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 };
	struct ibv_recv_wr *rbad = NULL;

	check_rc(ibv_post_recv(m2, &rwr, &rbad), "ibv_post_recv windows");
	ibv_wr_start(m1x);
	m1x->wr_id = 8;
	m1x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(m1x, key);
	ibv_wr_set_sge(m1x, smr->lkey, (uintptr_t)src, 32);
	wr_complete_ok(m1x, "ibv_wr_send_inv");
	for (int i = 0; i < 2; i++) {
		wc = mw_wait("ibv_wr_send_inv and its receive");
		if (wc.status != IBV_WC_SUCCESS)
			fail("windows: send with invalidate: wr_id %" PRIu64
			     " status %s", wc.wr_id,
			     ibv_wc_status_str(wc.status));
		if (wc.wr_id == 7 && (!(wc.wc_flags & IBV_WC_WITH_INV) ||
				      wc.invalidated_rkey != key ||
				      wc.byte_len != 32))
			fail("windows: receive of SEND_WITH_INV: flags 0x%x, "
			     "invalidated_rkey 0x%x (expected 0x%x), %u bytes",
			     wc.wc_flags, wc.invalidated_rkey, key,
			     wc.byte_len);
	}

	/* Bound again, then ibv_wr_local_inv; a WRITE after it is refused. */
	key = ibv_inc_rkey(key);
	ibv_wr_start(m2x);
	m2x->wr_id = 9;
	m2x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(m2x, mw2, key, &bi);
	m2x->wr_id = 10;
	ibv_wr_local_inv(m2x, key);
	wr_complete_ok(m2x, "ibv_wr_bind_mw + ibv_wr_local_inv");
	mw_expect("ibv_wr_bind_mw again", 9, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	mw_expect("ibv_wr_local_inv", 10, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);
	memset(win + 2048, UNTOUCHED, MW_LEN);
	mw_write(m1, 11, smr, src, MW_LEN, (uintptr_t)win + 2048, key);
	mw_expect("WRITE through an invalidated window", 11,
		  IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE);
	check_untouched("windows: after invalidation", win + 2048, MW_LEN);

	/* ibv_rereg_mr: new access on a region no window is bound to. */
	check_rc(ibv_rereg_mr(smr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
		 "ibv_rereg_mr");

	destroy_qp(m1, "windows M1");
	destroy_qp(m2, "windows M2");
	destroy_cq(cq, "windows");
	check_rc(ibv_dealloc_mw(mw2), "ibv_dealloc_mw type 2");
	check_rc(ibv_dereg_mr(wmr), "ibv_dereg_mr windows");
	check_rc(ibv_dereg_mr(smr), "ibv_dereg_mr windows source");
	free(win);
	free(src);
	printf("ok: memory windows (ibv_bind_mw type 1; IBV_WR_BIND_MW, "
	       "IBV_WR_LOCAL_INV; ibv_wr_bind_mw, ibv_wr_send_inv, "
	       "ibv_wr_local_inv; the invalidated key refused) and "
	       "ibv_rereg_mr\n");
}
