/*
 * What a conformance suite asks of a software NIC, checked through <infiniband/verbs.h> as any
 * C program would (issue 25 item 3), on softnic under softnic-run (cargo xtask interop runs
 * it; built with -libverbs against the system headers):
 *
 *  - QP types softnic does not serve (RAW_PACKET, DRIVER) and flow steering: EOPNOTSUPP;
 *  - ibv_query_gid_table with a too-small buffer fails, with room it gives the whole table;
 *  - the context's cmd_fd is a real descriptor (dup works), ibv_import_device is EOPNOTSUPP;
 *  - on-demand paging: advertised, an implicit region carries a send from and into pages
 *    never touched, ibv_advise_mr prefetches;
 *  - completion timestamps (device clock and wall clock) and ibv_query_rt_values_ex;
 *  - RTR toward a GID the IPv4 wire cannot reach fails with ENETUNREACH;
 *  - RDMA ATOMIC WRITE through ibv_wr_atomic_write;
 *  - the device's sysfs files, read through ibv_read_sysfs_file.
 *
 * Prints "conform: all checks passed" and exits 0, or names the first failed check and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "conform: FAILED %s:%d: %s: ", __FILE__,        \
                    __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, " (errno %d)\n", errno);                        \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

/* libibverbs exports it (IBVERBS_1.0); its header, <infiniband/driver.h>, is for providers. */
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static struct ibv_context *ctx;
static struct ibv_pd *pd;

static struct ibv_qp *rc_qp(struct ibv_cq *cq)
{
    struct ibv_qp_init_attr a = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &a);
    CHECK(qp, "create an RC QP");
    struct ibv_qp_attr init = {
        .qp_state = IBV_QPS_INIT, .port_num = 1,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    };
    CHECK(!ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS), "to INIT");
    return qp;
}

/* INIT -> RTR toward `gid`'s QP `qpn`: the verb's return value. */
static int to_rtr(struct ibv_qp *qp, union ibv_gid gid, uint32_t qpn)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qpn,
        .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
        .ah_attr = { .is_global = 1, .port_num = 1,
                     .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64 } },
    };
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static void to_rts(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
        .sq_psn = 0, .max_rd_atomic = 1,
    };
    CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                     IBV_QP_MAX_QP_RD_ATOMIC), "to RTS");
}

static void unserved(void)
{
    struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    CHECK(cq, "create a CQ");
    struct ibv_qp_init_attr raw = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RAW_PACKET,
        .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
    };
    errno = 0;
    CHECK(!ibv_create_qp(pd, &raw) && errno == EOPNOTSUPP, "RAW_PACKET QP");
    struct ibv_qp_init_attr_ex drv = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_DRIVER,
        .cap = raw.cap, .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd,
    };
    errno = 0;
    CHECK(!ibv_create_qp_ex(ctx, &drv) && errno == EOPNOTSUPP, "DRIVER QP");
    struct ibv_qp *qp = rc_qp(cq);
    struct {
        struct ibv_flow_attr attr;
        struct ibv_flow_spec_eth eth;
    } flow = {
        .attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(flow), .num_of_specs = 1,
                  .port = 1 },
        .eth = { .type = IBV_FLOW_SPEC_ETH, .size = sizeof(struct ibv_flow_spec_eth) },
    };
    errno = 0;
    CHECK(!ibv_create_flow(qp, &flow.attr) && errno == EOPNOTSUPP, "flow steering");
    CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_cq(cq), "clean up");
}

static void gids_and_fds(void)
{
    struct ibv_gid_entry e[16];
    CHECK(ibv_query_gid_table(ctx, e, 1, 0) < 0, "a GID table of one entry must not fit");
    ssize_t n = ibv_query_gid_table(ctx, e, 16, 0);
    CHECK(n == 2, "the whole table: %zd entries", n);
    CHECK(e[1].gid_type == IBV_GID_TYPE_ROCE_V2 && e[1].gid.raw[10] == 0xff,
          "entry 1 is the IPv4-mapped RoCE v2 GID");
    int fd = dup(ctx->cmd_fd);
    CHECK(fd >= 0, "dup(cmd_fd %d)", ctx->cmd_fd);
    errno = 0;
    CHECK(!ibv_import_device(fd) && errno == EOPNOTSUPP, "ibv_import_device");
    close(fd);
    char buf[64];
    int len = ibv_read_sysfs_file("/sys/class/infiniband/soft0/ports/1/gid_attrs/types", "1",
                                  buf, sizeof(buf));
    CHECK(len == 7 && !strcmp(buf, "RoCE v2"), "sysfs GID type: %d '%s'", len,
          len > 0 ? buf : "");
}

static uint64_t wall_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A send between two QPs of this device through an implicit on-demand region, from and into
 * pages never touched, completed on timestamped extended CQs. */
static void odp_and_timestamps(void)
{
    struct ibv_device_attr_ex dev;
    CHECK(!ibv_query_device_ex(ctx, NULL, &dev), "query_device_ex");
    CHECK(dev.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT, "implicit ODP advertised");
    CHECK((dev.odp_caps.per_transport_caps.rc_odp_caps &
           (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV)) ==
              (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV), "RC ODP caps");
    CHECK(dev.hca_core_clock > 0 && dev.completion_timestamp_mask, "a device clock");
    struct ibv_cq_init_attr_ex ca = {
        .cqe = 16,
        .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
    };
    struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
    CHECK(cq, "a timestamped extended CQ");
    struct ibv_qp *a = rc_qp(ibv_cq_ex_to_cq(cq)), *b = rc_qp(ibv_cq_ex_to_cq(cq));
    union ibv_gid gid;
    CHECK(!ibv_query_gid(ctx, 1, 1, &gid), "query GID 1");

    union ibv_gid nowhere = { .raw = { 0x20, 0x01, 0x0d, 0xb8, [15] = 1 } };
    int r = to_rtr(a, nowhere, b->qp_num);
    CHECK(r == ENETUNREACH, "RTR toward 2001:db8::1 gave %d", r);

    CHECK(!to_rtr(a, gid, b->qp_num) && !to_rtr(b, gid, a->qp_num), "to RTR");
    to_rts(a);
    to_rts(b);
    struct ibv_mr *mr = ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE |
                                                       IBV_ACCESS_ON_DEMAND);
    CHECK(mr, "an implicit on-demand region");
    char *src = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(src != MAP_FAILED && dst != MAP_FAILED, "mmap");
    memset(src, 0x3c, 5000);
    struct ibv_sge pre = { .addr = (uintptr_t)dst, .length = 8192, .lkey = mr->lkey };
    CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
                         &pre, 1), "ibv_advise_mr prefetch");
    struct ibv_sge rs = { .addr = (uintptr_t)dst, .length = 8192, .lkey = mr->lkey };
    struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *bad_r;
    CHECK(!ibv_post_recv(b, &rwr, &bad_r), "post a receive");
    struct ibv_sge ss = { .addr = (uintptr_t)src, .length = 5000, .lkey = mr->lkey };
    struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ss, .num_sge = 1,
                               .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
    uint64_t before = wall_ns();
    CHECK(!ibv_post_send(a, &swr, &bad_s), "post a send");
    uint64_t ts[2] = { 0, 0 }, wall[2] = { 0, 0 };
    int got = 0;
    for (int spin = 0; got < 2 && spin < 10000000; spin++) {
        struct ibv_poll_cq_attr pa = { 0 };
        if (ibv_start_poll(cq, &pa))
            continue;
        do {
            CHECK(cq->status == IBV_WC_SUCCESS, "completion %lu: %s", (unsigned long)cq->wr_id,
                  ibv_wc_status_str(cq->status));
            int i = cq->wr_id == 1;
            ts[i] = ibv_wc_read_completion_ts(cq);
            wall[i] = ibv_wc_read_completion_wallclock_ns(cq);
            if (i)
                CHECK(ibv_wc_read_byte_len(cq) == 5000, "received 5000 bytes");
            got++;
        } while (got < 2 && !ibv_next_poll(cq));
        ibv_end_poll(cq);
    }
    uint64_t after = wall_ns();
    CHECK(got == 2, "both completions");
    for (int i = 0; i < 5000; i++)
        CHECK(dst[i] == 0x3c, "byte %d", i);
    CHECK(wall[0] >= before && wall[1] <= after && wall[0] <= after, "wall clock stamps");
    struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
    CHECK(!ibv_query_rt_values_ex(ctx, &v), "ibv_query_rt_values_ex");
    CHECK(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK, "raw clock given");
    CHECK((uint64_t)v.raw_clock.tv_nsec >= ts[0] && (uint64_t)v.raw_clock.tv_nsec >= ts[1],
          "the device clock runs on past its stamps");
    CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_dereg_mr(mr) &&
          !ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), "clean up");
    munmap(src, 8192);
    munmap(dst, 8192);
}

/* RDMA ATOMIC WRITE through ibv_wr_atomic_write between two QPs of this device. */
static void atomic_write(void)
{
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq, "a CQ");
    struct ibv_qp *qp[2];
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_init_attr_ex a = {
            .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
            .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
            .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE,
        };
        qp[i] = ibv_create_qp_ex(ctx, &a);
        CHECK(qp[i], "an extended QP with IBV_QP_EX_WITH_ATOMIC_WRITE");
        struct ibv_qp_attr init = {
            .qp_state = IBV_QPS_INIT, .port_num = 1,
            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        };
        CHECK(!ibv_modify_qp(qp[i], &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                               IBV_QP_ACCESS_FLAGS), "to INIT");
    }
    union ibv_gid gid;
    CHECK(!ibv_query_gid(ctx, 1, 1, &gid), "query GID 1");
    CHECK(!to_rtr(qp[0], gid, qp[1]->qp_num) && !to_rtr(qp[1], gid, qp[0]->qp_num), "RTR");
    to_rts(qp[0]);
    to_rts(qp[1]);
    static uint64_t target __attribute__((aligned(8)));
    struct ibv_mr *mr = ibv_reg_mr(pd, &target, sizeof(target),
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr, "register the target");
    uint64_t value = 0x0123456789abcdefull;
    struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp[0]);
    CHECK(x, "ibv_qp_to_qp_ex");
    ibv_wr_start(x);
    x->wr_id = 9;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(x, mr->rkey, (uintptr_t)&target, &value);
    CHECK(!ibv_wr_complete(x), "ibv_wr_complete");
    struct ibv_wc wc;
    int n = 0;
    for (int spin = 0; n == 0 && spin < 10000000; spin++)
        n = ibv_poll_cq(cq, 1, &wc);
    CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE &&
          wc.wr_id == 9, "an ATOMIC_WRITE completion (%d, %s, opcode %d)", n,
          n == 1 ? ibv_wc_status_str(wc.status) : "-", n == 1 ? (int)wc.opcode : -1);
    CHECK(target == value, "the 8 bytes landed: %#llx", (unsigned long long)target);
    CHECK(!ibv_destroy_qp(qp[0]) && !ibv_destroy_qp(qp[1]) && !ibv_dereg_mr(mr) &&
          !ibv_destroy_cq(cq), "clean up");
}

int main(void)
{
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "one device");
    ctx = ibv_open_device(list[0]);
    CHECK(ctx, "open %s", ibv_get_device_name(list[0]));
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "a PD");
    unserved();
    gids_and_fds();
    odp_and_timestamps();
    atomic_write();
    CHECK(!ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "close");
    ibv_free_device_list(list);
    printf("conform: all checks passed\n");
    return 0;
}
