/* A child forked after its parent used the device (softnic-verbs' tests/fork.rs).
 *
 *   fork echo   The parent opens the device and makes a UD QP, then forks. The child opens
 *               the device from the list its parent got before the fork: a device of its
 *               own, at another address. Its parent's objects are not its own (a poll of the
 *               parent's CQ fails, a PD on the parent's context is refused, closing that
 *               context is closing nothing of the parent's). The child sends
 *               20 messages to its parent's QP, which echoes each one back: both devices
 *               work across the fork, between the two processes.
 *   fork busy   A thread of the parent makes and destroys objects without pause while the
 *               main thread forks 20 children, each of which opens a device and sends a
 *               message to itself. A child must never find softnic's registry held by a
 *               thread it does not have.
 *
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define QKEY 0x11
#define SLOT 4096
#define GRH 40

static const char *who = "parent";

#define CHECK(c, ...)                                                  \
    do {                                                               \
        if (!(c)) {                                                    \
            fprintf(stderr, "%s: ", who);                              \
            fprintf(stderr, __VA_ARGS__);                              \
            fprintf(stderr, " (errno %d)\n", errno);                   \
            exit(1);                                                   \
        }                                                              \
    } while (0)

struct ud {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf; /* 8 receive slots, then the send slot */
    union ibv_gid gid;
};

static void post_recv(struct ud *u, int slot) {
    struct ibv_sge s = {(uintptr_t)u->buf + slot * SLOT, SLOT, u->mr->lkey};
    struct ibv_recv_wr w = {.wr_id = slot, .sg_list = &s, .num_sge = 1}, *bad;
    CHECK(ibv_post_recv(u->qp, &w, &bad) == 0, "post_recv");
}

static void up(struct ud *u, struct ibv_device *dev) {
    u->ctx = ibv_open_device(dev);
    CHECK(u->ctx, "ibv_open_device");
    u->pd = ibv_alloc_pd(u->ctx);
    u->cq = ibv_create_cq(u->ctx, 32, NULL, NULL, 0);
    CHECK(u->pd && u->cq, "pd or cq");
    struct ibv_qp_init_attr ia = {
        .send_cq = u->cq, .recv_cq = u->cq, .qp_type = IBV_QPT_UD,
        .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    u->qp = ibv_create_qp(u->pd, &ia);
    CHECK(u->qp, "ibv_create_qp");
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
    CHECK(!ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
          "INIT");
    a.qp_state = IBV_QPS_RTR;
    CHECK(!ibv_modify_qp(u->qp, &a, IBV_QP_STATE), "RTR");
    a.qp_state = IBV_QPS_RTS;
    CHECK(!ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
    u->buf = calloc(9, SLOT);
    u->mr = ibv_reg_mr(u->pd, u->buf, 9 * SLOT, IBV_ACCESS_LOCAL_WRITE);
    CHECK(u->buf && u->mr, "ibv_reg_mr");
    CHECK(!ibv_query_gid(u->ctx, 1, 1, &u->gid), "ibv_query_gid");
    for (int i = 0; i < 8; i++)
        post_recv(u, i);
}

/* Sends `len` bytes of the send slot to `qpn` at `gid`, and waits for the send's completion. */
static void send_to(struct ud *u, union ibv_gid gid, uint32_t qpn, uint32_t len) {
    struct ibv_ah_attr aa = {
        .is_global = 1, .grh = {.dgid = gid, .sgid_index = 1, .hop_limit = 1}, .port_num = 1};
    struct ibv_ah *ah = ibv_create_ah(u->pd, &aa);
    CHECK(ah, "ibv_create_ah");
    struct ibv_sge s = {(uintptr_t)u->buf + 8 * SLOT, len, u->mr->lkey};
    struct ibv_send_wr w = {.wr_id = 100, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                            .send_flags = IBV_SEND_SIGNALED,
                            .wr.ud = {.ah = ah, .remote_qpn = qpn, .remote_qkey = QKEY}}, *bad;
    CHECK(!ibv_post_send(u->qp, &w, &bad), "ibv_post_send");
    struct ibv_wc wc;
    time_t t0 = time(NULL);
    int n;
    while ((n = ibv_poll_cq(u->cq, 1, &wc)) == 0 || (n == 1 && wc.opcode == IBV_WC_RECV)) {
        CHECK(n == 0, "a receive before the send completed");
        CHECK(time(NULL) - t0 < 10, "no send completion");
    }
    CHECK(n == 1 && wc.status == IBV_WC_SUCCESS, "send completion %d", wc.status);
    ibv_destroy_ah(ah);
}

/* Waits up to `secs` for a receive; its slot, or -1. */
static int wait_recv(struct ud *u, int secs, struct ibv_wc *wc) {
    time_t t0 = time(NULL);
    while (time(NULL) - t0 < secs) {
        int n = ibv_poll_cq(u->cq, 1, wc);
        CHECK(n >= 0, "ibv_poll_cq");
        if (n == 1) {
            CHECK(wc->status == IBV_WC_SUCCESS && wc->opcode == IBV_WC_RECV, "receive %d",
                  wc->status);
            return (int)wc->wr_id;
        }
    }
    return -1;
}

/* The child of `echo`: a device of its own, from the list its parent got. */
static int echo_child(struct ibv_device **list, struct ud *parent) {
    who = "child";
    alarm(30);
    CHECK(!strcmp(ibv_get_device_name(list[0]), "soft0"), "the parent's listed device's name");
    /* The parent's objects are not the child's. */
    struct ibv_wc wc;
    CHECK(ibv_poll_cq(parent->cq, 1, &wc) < 0, "a poll of the parent's CQ did not fail");
    errno = 0;
    CHECK(!ibv_alloc_pd(parent->ctx) && errno, "a PD on the parent's context");
    /* Closing it closes the child's copy of the device, as on a kernel: the parent's stays. */
    CHECK(ibv_close_device(parent->ctx) == 0, "closing the parent's context in the child");
    struct ud u;
    up(&u, list[0]);
    CHECK(memcmp(&u.gid, &parent->gid, sizeof u.gid), "the child's device has its parent's GID");
    for (int i = 0; i < 20; i++) {
        char *msg = u.buf + 8 * SLOT;
        memcpy(msg, &u.gid, 16);
        memcpy(msg + 16, &u.qp->qp_num, 4);
        memcpy(msg + 20, &i, 4);
        send_to(&u, parent->gid, parent->qp->qp_num, 24);
        int slot = wait_recv(&u, 10, &wc);
        CHECK(slot >= 0, "no echo of message %d", i);
        int back;
        memcpy(&back, u.buf + slot * SLOT + GRH + 20, 4);
        CHECK(back == i, "echo %d of message %d", back, i);
        post_recv(&u, slot);
    }
    CHECK(!ibv_destroy_qp(u.qp) && !ibv_close_device(u.ctx), "teardown");
    return 0;
}

static int echo(void) {
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "ibv_get_device_list");
    struct ud p;
    up(&p, list[0]);
    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0)
        exit(echo_child(list, &p));
    /* The parent: echo every message until the child is gone. */
    int echoed = 0, status;
    while (waitpid(child, &status, WNOHANG) == 0) {
        struct ibv_wc wc;
        int slot = wait_recv(&p, 1, &wc);
        if (slot < 0)
            continue;
        char *m = p.buf + slot * SLOT + GRH;
        union ibv_gid gid;
        uint32_t qpn;
        memcpy(&gid, m, 16);
        memcpy(&qpn, m + 16, 4);
        memcpy(p.buf + 8 * SLOT, m, 24);
        post_recv(&p, slot);
        send_to(&p, gid, qpn, 24);
        echoed++;
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed");
    CHECK(echoed == 20, "%d echoed", echoed);
    ibv_free_device_list(list);
    return 0;
}

static volatile int stop;

static void *churn(void *arg) {
    struct ibv_context *ctx = arg;
    while (!stop) {
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
        CHECK(pd && cq, "churn");
        ibv_destroy_cq(cq);
        ibv_dealloc_pd(pd);
    }
    return NULL;
}

static int busy(void) {
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "ibv_get_device_list");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    pthread_t t;
    CHECK(!pthread_create(&t, NULL, churn, ctx), "pthread_create");
    for (int i = 0; i < 20; i++) {
        pid_t child = fork();
        CHECK(child >= 0, "fork");
        if (child == 0) {
            who = "child";
            alarm(20);
            struct ibv_device **own = ibv_get_device_list(&n);
            CHECK(own && n == 1, "the child's ibv_get_device_list");
            struct ud u;
            up(&u, own[0]);
            memset(u.buf + 8 * SLOT, i, 8);
            send_to(&u, u.gid, u.qp->qp_num, 8);
            struct ibv_wc wc;
            CHECK(wait_recv(&u, 10, &wc) >= 0, "no message to itself");
            exit(0);
        }
        int status;
        CHECK(waitpid(child, &status, 0) == child, "waitpid");
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d failed (status %#x)", i,
              status);
    }
    stop = 1;
    pthread_join(t, NULL);
    CHECK(!ibv_close_device(ctx), "ibv_close_device");
    return 0;
}

int main(int argc, char **argv) {
    int r = argc > 1 && !strcmp(argv[1], "busy") ? busy() : echo();
    if (r == 0)
        printf("ok\n");
    return r;
}
