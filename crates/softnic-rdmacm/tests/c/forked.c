/* rdma_cm across a fork (softnic-rdmacm's tests/programs.rs): `forked <addr>`.
 *
 * The parent listens at <addr> and connects to itself (ids A and B, an RC connection). Then
 * it forks. The child makes ids of its own (its own device, at another address: its parent
 * holds <addr>), connects to its parent's listener and exits connected. The parent accepts
 * the child's connection and hears it end; its own connection A-B stays up (the child's exit
 * must not disconnect its parent's ids) and carries a message after the child is gone. The
 * parent's channel is not the child's: refused there, and destroying it there is nothing.
 * Nor are its parent's rsockets (EBADF there): a datagram rsocket of the child's own goes
 * both ways with one of its parent's, its port answered by a SIDR service of its own.
 *
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* Makes an RC QP with CQs of its own on `id` (librdmacm writes the CQs it made into the
 * attributes: each QP gets a fresh copy). */
static int create_qp(struct rdma_cm_id *id) {
    struct ibv_qp_init_attr rc = {
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    return rdma_create_qp(id, NULL, &rc);
}

/* The next event on `ch`: its type and id (acked). */
static enum rdma_cm_event_type next(struct rdma_event_channel *ch, struct rdma_cm_id **id,
                                    struct rdma_cm_id **listen) {
    struct rdma_cm_event *e;
    CHECK(!rdma_get_cm_event(ch, &e), "rdma_get_cm_event");
    enum rdma_cm_event_type t = e->event;
    *id = e->id;
    if (listen)
        *listen = e->listen_id;
    CHECK(e->status == 0 || t == RDMA_CM_EVENT_DISCONNECTED, "event %s status %d",
          rdma_event_str(t), e->status);
    rdma_ack_cm_event(e);
    return t;
}

/* Connects a new id on `ch` to `to`, up to sending the REQ. */
static struct rdma_cm_id *connect_to(struct rdma_event_channel *ch, struct sockaddr_in *to) {
    struct rdma_cm_id *id, *got;
    CHECK(!rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), "rdma_create_id");
    CHECK(!rdma_resolve_addr(id, NULL, (struct sockaddr *)to, 2000), "rdma_resolve_addr");
    CHECK(next(ch, &got, NULL) == RDMA_CM_EVENT_ADDR_RESOLVED && got == id, "address");
    CHECK(!rdma_resolve_route(id, 2000), "rdma_resolve_route");
    CHECK(next(ch, &got, NULL) == RDMA_CM_EVENT_ROUTE_RESOLVED && got == id, "route");
    CHECK(!create_qp(id), "rdma_create_qp");
    struct rdma_conn_param p = {.retry_count = 7, .rnr_retry_count = 7};
    CHECK(!rdma_connect(id, &p), "rdma_connect");
    return id;
}

/* A datagram each way between a datagram rsocket of the child's own and its parent's `ds`
 * at `dat`. */
static void datagrams(int parents_ds, struct sockaddr_in *dat) {
    errno = 0;
    CHECK(rsend(parents_ds, "x", 1, 0) == -1 && errno == EBADF, "the parent's rsocket");
    int cs = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(cs >= 0, "rsocket");
    CHECK(rsendto(cs, "hi", 2, 0, (struct sockaddr *)dat, sizeof *dat) == 2, "rsendto");
    char buf[8];
    struct pollfd p = {.fd = cs, .events = POLLIN};
    CHECK(rpoll(&p, 1, 20000) == 1, "no answer from the parent");
    CHECK(rrecv(cs, buf, sizeof buf, 0) == 2 && !memcmp(buf, "yo", 2), "the parent's answer");
    CHECK(rclose(cs) == 0, "rclose");
}

static int child(struct sockaddr_in *to, struct ibv_pd *parents_pd,
                 struct rdma_event_channel *parents_ch, int parents_ds, struct sockaddr_in *dat) {
    who = "child";
    alarm(30);
    datagrams(parents_ds, dat);
    errno = 0;
    CHECK(!ibv_alloc_mw(parents_pd, IBV_MW_TYPE_1) && errno, "a window on the parent's PD");
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    /* The parent's channel is not the child's (nor the child's channel of the same number). */
    struct rdma_cm_event *e;
    CHECK(rdma_get_cm_event(parents_ch, &e) == -1 && errno == EINVAL, "the parent's channel");
    struct rdma_cm_id *stray;
    CHECK(rdma_create_id(parents_ch, &stray, NULL, RDMA_PS_TCP) == -1, "an id on it");
    rdma_destroy_event_channel(parents_ch);
    struct rdma_cm_id *id = connect_to(ch, to), *got;
    CHECK(next(ch, &got, NULL) == RDMA_CM_EVENT_ESTABLISHED && got == id, "established");
    CHECK(id->route.addr.src_sin.sin_addr.s_addr != to->sin_addr.s_addr,
          "the child's device has its parent's address");
    /* Exits connected: its ids are destroyed at exit, its parent's are not its own. */
    return 0;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: forked <addr>");
    alarm(60);
    struct sockaddr_in at = {.sin_family = AF_INET};
    CHECK(inet_pton(AF_INET, argv[1], &at.sin_addr) == 1, "an IPv4 address");
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *l, *got, *listen;
    CHECK(!rdma_create_id(ch, &l, NULL, RDMA_PS_TCP), "rdma_create_id");
    CHECK(!rdma_bind_addr(l, (struct sockaddr *)&at) && !rdma_listen(l, 8), "listen");
    at.sin_port = rdma_get_src_port(l);

    /* A connects to B, both in this process. */
    struct rdma_cm_id *a = connect_to(ch, &at), *b = NULL;
    int up = 0;
    while (up < 2) {
        enum rdma_cm_event_type t = next(ch, &got, &listen);
        if (t == RDMA_CM_EVENT_CONNECT_REQUEST) {
            b = got;
            CHECK(!create_qp(b) && !rdma_accept(b, NULL), "accept B");
        } else {
            CHECK(t == RDMA_CM_EVENT_ESTABLISHED && (got == a || got == b), "A-B: %s",
                  rdma_event_str(t));
            up++;
        }
    }
    static char buf[64];
    struct ibv_mr *mr = ibv_reg_mr(b->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *amr = ibv_reg_mr(a->pd, buf + 32, 32, 0);
    CHECK(mr && amr, "ibv_reg_mr");

    /* A datagram rsocket, its port answered by this process's SIDR service. */
    struct sockaddr_in dat = at;
    dat.sin_port = htons(7395);
    int ds = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(ds >= 0 && !rbind(ds, (struct sockaddr *)&dat, sizeof dat), "a datagram rsocket");

    pid_t kid = fork();
    CHECK(kid >= 0, "fork");
    if (kid == 0)
        exit(child(&at, a->pd, ch, ds, &dat));

    /* The child's datagram, from its own address, answered. */
    char dbuf[8];
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    struct pollfd p = {.fd = ds, .events = POLLIN};
    CHECK(rpoll(&p, 1, 20000) == 1, "no datagram from the child");
    CHECK(rrecvfrom(ds, dbuf, sizeof dbuf, 0, (struct sockaddr *)&from, &flen) == 2 &&
              !memcmp(dbuf, "hi", 2),
          "the child's datagram");
    CHECK(from.sin_addr.s_addr != dat.sin_addr.s_addr,
          "the child's datagram from its parent's address");
    CHECK(rsendto(ds, "yo", 2, 0, (struct sockaddr *)&from, flen) == 2, "rsendto");

    /* The child's connection: accepted, then over when the child exits. */
    struct rdma_cm_id *c = NULL;
    for (int over = 0; !over;) {
        enum rdma_cm_event_type t = next(ch, &got, &listen);
        CHECK(got != a && got != b, "%s on the parent's own connection", rdma_event_str(t));
        if (t == RDMA_CM_EVENT_CONNECT_REQUEST) {
            c = got;
            CHECK(!create_qp(c) && !rdma_accept(c, NULL), "accept the child");
        } else if (t == RDMA_CM_EVENT_DISCONNECTED) {
            over = got == c;
            /* The DREP the exiting child waits for. */
            CHECK(!rdma_disconnect(c), "rdma_disconnect");
        } else {
            CHECK(t == RDMA_CM_EVENT_ESTABLISHED && got == c, "%s", rdma_event_str(t));
        }
    }
    int status;
    CHECK(waitpid(kid, &status, 0) == kid && WIFEXITED(status) && !WEXITSTATUS(status),
          "the child failed (status %#x)", status);

    /* A-B is still up: a message goes from A to B. */
    struct ibv_sge rs = {(uintptr_t)buf, 32, mr->lkey}, ss = {(uintptr_t)buf + 32, 8, amr->lkey};
    struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *brw;
    struct ibv_send_wr sw = {.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED}, *bsw;
    memcpy(buf + 32, "still up", 8);
    CHECK(!ibv_post_recv(b->qp, &rw, &brw) && !ibv_post_send(a->qp, &sw, &bsw), "post");
    struct ibv_wc wc;
    time_t t0 = time(NULL);
    int n;
    while ((n = ibv_poll_cq(b->recv_cq, 1, &wc)) == 0)
        CHECK(time(NULL) - t0 < 10, "no message from A to B");
    CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && !memcmp(buf, "still up", 8),
          "A to B: status %d", wc.status);
    /* No event waits for A or B either. */
    int flags = fcntl(ch->fd, F_GETFL);
    CHECK(flags >= 0 && fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl");
    struct rdma_cm_event *e;
    CHECK(rdma_get_cm_event(ch, &e) && errno == EAGAIN, "an event for the parent's ids");
    CHECK(rclose(ds) == 0, "rclose");
    printf("ok\n");
    return 0;
}
