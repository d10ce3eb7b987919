/* Ids reached from several threads.
 * - turns <address>: while a synchronous rdma_connect waits for its event (the listener, in
 *   this process, holds the request unanswered), another thread's calls on the same id go on
 *   and return; then the request is rejected and the wait ends with ECONNREFUSED.
 * - turns <address> late-ack: an event taken before its id is destroyed still names a live id
 *   until it is acked (the thread taking events may be reading it while another destroys it).
 * - turns <address> late-get: a thread that calls rdma_get_cm_event on a channel another
 *   thread has just destroyed waits, as rping's event thread must while its main thread exits
 *   (returning an error there, rping calls exit(-1)).
 * - turns <address> params: what librdmacm (or the kernel under it) refuses before anything is
 *   sent: options of the wrong size (EINVAL), level or name (ENOSYS) or at NULL (EFAULT), an
 *   ACK timeout of a UD id; and (EINVAL) a synchronous id moved to a channel of its own again,
 *   an id of no port space, an address of no family it knows, an RC connect with neither a QP
 *   nor parameters, responder resources above the device's, a second QP on an id; an id of
 *   RDMA_PS_IB is made, one of RDMA_PS_IPOIB and an endpoint of RDMA_PS_IB with a UD QP are
 *   not (EPROTONOSUPPORT: softnic's RDMA_PS_IB is RC and XRC only).
 * - turns <address> exit-server, then turns <address> exit-client (another process): the client
 *   connects and exits without disconnecting or destroying anything; the server must hear
 *   DISCONNECTED soon after (10 s at most), as the kernel's CM sends the DREQ of a process's
 *   connections when it exits.
 * - turns <address> taken-qp: a connected QP the program took off its id (`id->qp = NULL`, as
 *   libfabric's verbs provider does with XRC QPs that outlive their connection's id) stays
 *   in RTS through that id's disconnect (server side) and destruction (client side), as
 *   librdmacm acts on `id->qp` only.
 * - turns <address> xrc-ep: synchronous XRC endpoints on RDMA_PS_IB, as librdmacm makes them:
 *   the client's id and QP are XRC_SEND with a send CQ and no receive CQ; the listener's
 *   request is XRC_RECV with a target QP; rdma_create_srq_ex, given only the type, makes an
 *   XRC SRQ in the default domain with a receive CQ (a second SRQ is EINVAL); a SEND naming
 *   the SRQ's number (from the accept's private data) lands in it and completes in that CQ;
 *   the target QP's destruction and a failed creation leave that CQ; rdma_destroy_ep takes
 *   the SRQ with the QP and the id.
 * Prints "ok" and exits 0 on success; says what went wrong otherwise. <address> is the
 * device's (softnic's SOFTNIC_ADDR). */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdatomic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct rdma_cm_id *client;
static atomic_int connect_done;
static int connect_ret, connect_errno;

static int fail(const char *what) {
    printf("%s: %s\n", what, strerror(errno));
    return 1;
}

static void *connect_thread(void *arg) {
    (void)arg;
    connect_ret = rdma_connect(client, NULL);
    connect_errno = errno;
    atomic_store(&connect_done, 1);
    return NULL;
}

static int late_ack(struct sockaddr_in *a) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    int mark;
    if (!ch || rdma_create_id(ch, &id, &mark, RDMA_PS_TCP))
        return fail("id");
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)a, 2000))
        return fail("resolve_addr");
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev))
        return fail("get_cm_event");
    if (rdma_destroy_id(id))
        return fail("destroy_id");
    /* The event's id, read after its destruction and before the ack. */
    if (ev->id != id || ev->id->context != &mark || ev->id->channel != ch) {
        printf("the event's id changed after its destruction\n");
        return 1;
    }
    rdma_ack_cm_event(ev);
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}

static atomic_int get_returned;

static void *late_get_thread(void *arg) {
    struct rdma_cm_event *ev;
    rdma_get_cm_event((struct rdma_event_channel *)arg, &ev);
    atomic_store(&get_returned, 1);
    return NULL;
}

static int late_get(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch)
        return fail("channel");
    rdma_destroy_event_channel(ch);
    pthread_t t;
    if (pthread_create(&t, NULL, late_get_thread, ch))
        return fail("thread");
    usleep(300000);
    if (atomic_load(&get_returned)) {
        printf("rdma_get_cm_event on a destroyed channel returned\n");
        return 1;
    }
    /* The thread stays in its wait; exiting ends it. */
    printf("ok\n");
    return 0;
}

static int params(struct sockaddr_in *a) {
    struct rdma_cm_id *id;
    errno = 0;
    if (rdma_create_id(NULL, &id, NULL, (enum rdma_port_space)0x999) != -1 || errno != EINVAL) {
        printf("an id of no port space: errno %d, expected EINVAL\n", errno);
        return 1;
    }
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_IB))
        return fail("an id of RDMA_PS_IB");
    rdma_destroy_id(id);
    errno = 0;
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_IPOIB) != -1 || errno != EPROTONOSUPPORT) {
        printf("an id of RDMA_PS_IPOIB: errno %d, expected EPROTONOSUPPORT\n", errno);
        return 1;
    }
    struct rdma_addrinfo ud_ib = {.ai_port_space = RDMA_PS_IB, .ai_qp_type = IBV_QPT_UD,
                                  .ai_dst_addr = (struct sockaddr *)a,
                                  .ai_dst_len = sizeof *a};
    errno = 0;
    if (rdma_create_ep(&id, &ud_ib, NULL, NULL) != -1 || errno != EPROTONOSUPPORT) {
        printf("a UD endpoint of RDMA_PS_IB: errno %d, expected EPROTONOSUPPORT\n", errno);
        return 1;
    }
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
        return fail("id");
    uint8_t byte = 16;
    int on = 1;
    struct {
        int level, name;
        void *val;
        size_t len;
        int err;
        const char *what;
    } opts[] = {
        {RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &byte, sizeof byte, 0, "a TOS byte"},
        {RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &on, sizeof on, EINVAL, "a TOS of an int"},
        {RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on, 0, "address reuse"},
        {RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &byte, sizeof byte, EINVAL, "IPv6-only of a byte"},
        {RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &byte, sizeof byte, 0, "an ACK timeout"},
        {RDMA_OPTION_ID, 99, &on, sizeof on, ENOSYS, "an option of no name"},
        {7, RDMA_OPTION_ID_TOS, &byte, sizeof byte, ENOSYS, "an option of no level"},
        {RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &on, sizeof on, EINVAL, "a path of 4 bytes"},
        {RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, NULL, 1, EFAULT, "a TOS at NULL"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        errno = 0;
        int r = rdma_set_option(id, opts[i].level, opts[i].name, opts[i].val, opts[i].len);
        if (opts[i].err ? (r != -1 || errno != opts[i].err) : r != 0) {
            printf("set_option, %s: %d, errno %d, expected %d\n", opts[i].what, r, errno,
                   opts[i].err);
            return 1;
        }
    }
    errno = 0;
    if (rdma_migrate_id(id, NULL) != -1 || errno != EINVAL) {
        printf("a synchronous id to a channel of its own again: errno %d, expected EINVAL\n",
               errno);
        return 1;
    }
    errno = 0;
    if (rdma_notify(id, IBV_EVENT_COMM_EST) != -1 || errno != EINVAL) {
        printf("COMM_EST of an id not connecting: errno %d, expected EINVAL\n", errno);
        return 1;
    }
    struct rdma_cm_id *ud;
    if (rdma_create_id(NULL, &ud, NULL, RDMA_PS_UDP))
        return fail("UD id");
    errno = 0;
    if (rdma_set_option(ud, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &byte, 1) != -1 ||
        errno != EINVAL) {
        printf("an ACK timeout of a UD id: errno %d, expected EINVAL\n", errno);
        return 1;
    }
    rdma_destroy_id(ud);
    struct sockaddr unix_addr = {.sa_family = AF_UNIX};
    errno = 0;
    if (rdma_bind_addr(id, &unix_addr) != -1 || errno != EINVAL) {
        printf("binding to an AF_UNIX address: errno %d, expected EINVAL\n", errno);
        return 1;
    }
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)a, 2000) || rdma_resolve_route(id, 2000))
        return fail("resolve");
    errno = 0;
    if (rdma_connect(id, NULL) != -1 || errno != EINVAL) {
        printf("connect with no QP and no parameters: errno %d, expected EINVAL\n", errno);
        return 1;
    }
    struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                          .max_send_sge = 1, .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC};
    if (rdma_create_qp(id, NULL, &qa))
        return fail("create_qp");
    struct ibv_qp *first = id->qp;
    errno = 0;
    if (rdma_create_qp(id, NULL, &qa) != -1 || errno != EINVAL || id->qp != first) {
        printf("a second QP: errno %d, expected EINVAL and the first QP kept\n", errno);
        return 1;
    }
    struct ibv_device_attr dev;
    if (ibv_query_device(id->verbs, &dev))
        return fail("query_device");
    struct rdma_conn_param p = {.responder_resources = dev.max_qp_rd_atom + 1,
                                .initiator_depth = 1, .retry_count = 7};
    errno = 0;
    if (rdma_connect(id, &p) != -1 || errno != EINVAL) {
        printf("connect with %d responder resources: errno %d, expected EINVAL\n",
               p.responder_resources, errno);
        return 1;
    }
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    printf("ok\n");
    return 0;
}

static struct ibv_qp_init_attr rc_attr = {.cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                                   .max_send_sge = 1, .max_recv_sge = 1},
                                           .qp_type = IBV_QPT_RC};

/* The next event of `ch` within `ms` milliseconds, or NULL. */
static struct rdma_cm_event *event_within(struct rdma_event_channel *ch, int ms) {
    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev;
    if (poll(&p, 1, ms) != 1 || rdma_get_cm_event(ch, &ev))
        return NULL;
    return ev;
}

static int exit_server(struct sockaddr_in *a) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *listener;
    if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
        return fail("listener id");
    if (rdma_bind_addr(listener, (struct sockaddr *)a) || rdma_listen(listener, 4))
        return fail("listen");
    enum rdma_cm_event_type want[] = {RDMA_CM_EVENT_CONNECT_REQUEST, RDMA_CM_EVENT_ESTABLISHED,
                                      RDMA_CM_EVENT_DISCONNECTED};
    for (int i = 0; i < 3; i++) {
        struct rdma_cm_event *ev = event_within(ch, i == 0 ? 50000 : 10000);
        if (!ev) {
            printf("no %s in time\n", rdma_event_str(want[i]));
            return 1;
        }
        if (ev->event != want[i]) {
            printf("expected %s, got %s\n", rdma_event_str(want[i]), rdma_event_str(ev->event));
            return 1;
        }
        struct rdma_cm_id *id = ev->id;
        rdma_ack_cm_event(ev);
        if (i == 0 && (rdma_create_qp(id, NULL, &rc_attr) || rdma_accept(id, NULL)))
            return fail("accept");
    }
    printf("ok\n");
    return 0;
}

static int exit_client(struct sockaddr_in *a) {
    struct rdma_cm_id *id;
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
        return fail("id");
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)a, 2000) || rdma_resolve_route(id, 2000))
        return fail("resolve");
    if (rdma_create_qp(id, NULL, &rc_attr))
        return fail("create_qp");
    struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1};
    if (rdma_connect(id, &p))
        return fail("connect");
    printf("ok\n");
    /* Nothing disconnected, nothing destroyed. */
    exit(0);
}

static enum ibv_qp_state state_of(struct ibv_qp *qp) {
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init))
        return IBV_QPS_UNKNOWN;
    return attr.qp_state;
}

static int taken_qp(struct sockaddr_in *a) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *listener, *cl, *srv = NULL;
    if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) ||
        rdma_create_id(ch, &cl, NULL, RDMA_PS_TCP))
        return fail("ids");
    if (rdma_bind_addr(listener, (struct sockaddr *)a) || rdma_listen(listener, 4))
        return fail("listen");
    if (rdma_resolve_addr(cl, NULL, (struct sockaddr *)a, 2000))
        return fail("resolve_addr");
    int established = 0;
    while (established < 2) {
        struct rdma_cm_event *ev = event_within(ch, 10000);
        if (!ev) {
            printf("no event in time\n");
            return 1;
        }
        enum rdma_cm_event_type e = ev->event;
        struct rdma_cm_id *id = ev->id;
        rdma_ack_cm_event(ev);
        struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1};
        if (e == RDMA_CM_EVENT_ADDR_RESOLVED) {
            if (rdma_resolve_route(id, 2000))
                return fail("resolve_route");
        } else if (e == RDMA_CM_EVENT_ROUTE_RESOLVED) {
            if (rdma_create_qp(id, NULL, &rc_attr) || rdma_connect(id, &p))
                return fail("connect");
        } else if (e == RDMA_CM_EVENT_CONNECT_REQUEST) {
            srv = id;
            if (rdma_create_qp(id, NULL, &rc_attr) || rdma_accept(id, &p))
                return fail("accept");
        } else if (e == RDMA_CM_EVENT_ESTABLISHED) {
            established++;
        } else {
            printf("unexpected %s\n", rdma_event_str(e));
            return 1;
        }
    }
    struct ibv_qp *sq = srv->qp, *cq = cl->qp;
    if (state_of(sq) != IBV_QPS_RTS || state_of(cq) != IBV_QPS_RTS) {
        printf("not connected\n");
        return 1;
    }
    srv->qp = NULL;
    if (rdma_disconnect(srv))
        return fail("disconnect");
    if (state_of(sq) != IBV_QPS_RTS) {
        printf("the disconnect moved a QP taken off its id to %d\n", state_of(sq));
        return 1;
    }
    cl->qp = NULL;
    if (rdma_destroy_id(cl))
        return fail("destroy_id");
    if (state_of(cq) != IBV_QPS_RTS) {
        printf("destroying the id moved a QP taken off it to %d\n", state_of(cq));
        return 1;
    }
    ibv_destroy_qp(sq);
    ibv_destroy_qp(cq);
    printf("ok\n");
    return 0;
}

static struct rdma_cm_id *xrc_client;
static int xrc_connect_ret;

static void *xrc_connect(void *arg) {
    (void)arg;
    xrc_connect_ret = rdma_connect(xrc_client, NULL);
    return NULL;
}

static int xrc_ep(const char *addr) {
    struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_IB,
                                  .ai_qp_type = IBV_QPT_XRC_RECV}, *res;
    struct rdma_cm_id *listener, *srv;
    if (rdma_getaddrinfo(addr, "7480", &hints, &res))
        return fail("getaddrinfo (passive)");
    struct ibv_qp_init_attr attr = {.cap = {.max_recv_wr = 1, .max_recv_sge = 1}};
    if (rdma_create_ep(&listener, res, NULL, &attr) || rdma_listen(listener, 1))
        return fail("listening endpoint");
    rdma_freeaddrinfo(res);

    hints.ai_flags = 0;
    hints.ai_qp_type = IBV_QPT_XRC_SEND;
    if (rdma_getaddrinfo(addr, "7480", &hints, &res))
        return fail("getaddrinfo (active)");
    attr = (struct ibv_qp_init_attr){.cap = {.max_send_wr = 1, .max_send_sge = 1,
                                             .max_inline_data = 16},
                                     .sq_sig_all = 1};
    if (rdma_create_ep(&xrc_client, res, NULL, &attr))
        return fail("active endpoint");
    rdma_freeaddrinfo(res);
    if (xrc_client->qp_type != IBV_QPT_XRC_SEND || !xrc_client->qp ||
        xrc_client->qp->qp_type != IBV_QPT_XRC_SEND || attr.qp_type != IBV_QPT_XRC_SEND) {
        printf("the active endpoint's id or QP is not XRC_SEND\n");
        return 1;
    }
    if (!xrc_client->send_cq || xrc_client->recv_cq) {
        printf("an XRC initiator got CQs %p (send) and %p (receive): expected one send CQ\n",
               (void *)xrc_client->send_cq, (void *)xrc_client->recv_cq);
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, xrc_connect, NULL);

    if (rdma_get_request(listener, &srv))
        return fail("get_request");
    if (srv->qp_type != IBV_QPT_XRC_RECV || !srv->qp || srv->qp->qp_type != IBV_QPT_XRC_RECV) {
        printf("the request's id or QP is not XRC_RECV\n");
        return 1;
    }
    struct ibv_srq_init_attr_ex sa = {.attr = {.max_wr = 2, .max_sge = 1},
                                      .comp_mask = IBV_SRQ_INIT_ATTR_TYPE,
                                      .srq_type = IBV_SRQT_XRC};
    if (rdma_create_srq_ex(srv, &sa))
        return fail("create_srq_ex");
    if (!srv->srq || !srv->recv_cq || sa.cq != srv->recv_cq || !sa.xrcd) {
        printf("the XRC SRQ, its CQ or its domain is missing\n");
        return 1;
    }
    /* softnic's own answer: librdmacm makes a second SRQ and loses the first. */
    struct ibv_srq_init_attr_ex again = sa;
    errno = 0;
    if (rdma_create_srq_ex(srv, &again) != -1 || errno != EINVAL) {
        printf("a second SRQ on an id: errno %d, expected EINVAL\n", errno);
        return 1;
    }
    /* The target QP goes and comes back: its destruction, and a creation that fails, leave
     * the CQ the XRC SRQ completes in. */
    struct ibv_cq *srq_cq = srv->recv_cq;
    rdma_destroy_qp(srv);
    if (srv->recv_cq != srq_cq) {
        printf("rdma_destroy_qp took the XRC SRQ's CQ\n");
        return 1;
    }
    struct ibv_qp_init_attr_ex unknown = {.comp_mask = IBV_QP_INIT_ATTR_PD | 1u << 30,
                                      .qp_type = IBV_QPT_XRC_RECV};
    if (rdma_create_qp_ex(srv, &unknown) != -1) {
        printf("a QP of unknown attributes was made\n");
        return 1;
    }
    if (srv->recv_cq != srq_cq) {
        printf("a failed rdma_create_qp_ex took the XRC SRQ's CQ\n");
        return 1;
    }
    struct ibv_qp_init_attr target = {.qp_type = IBV_QPT_XRC_RECV};
    if (rdma_create_qp(srv, NULL, &target))
        return fail("the target QP again");
    uint32_t srqn;
    if (ibv_get_srq_num(srv->srq, &srqn))
        return fail("get_srq_num");
    char got[16] = {0};
    struct ibv_mr *mr = rdma_reg_msgs(srv, got, sizeof got);
    if (!mr || rdma_post_recv(srv, NULL, got, sizeof got, mr))
        return fail("receive");
    uint32_t be = htonl(srqn);
    struct rdma_conn_param p = {.private_data = &be, .private_data_len = sizeof be};
    if (rdma_accept(srv, &p))
        return fail("accept");
    pthread_join(t, NULL);
    if (xrc_connect_ret)
        return fail("connect");
    if (ntohl(*(const uint32_t *)xrc_client->event->param.conn.private_data) != srqn) {
        printf("the accept's private data did not reach the client\n");
        return 1;
    }
    char msg[16] = "to the XRC SRQ";
    struct ibv_sge sge = {.addr = (uintptr_t)msg, .length = sizeof msg};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_INLINE}, *bad;
    wr.qp_type.xrc.remote_srqn = srqn;
    struct ibv_wc wc;
    if (ibv_post_send(xrc_client->qp, &wr, &bad) || rdma_get_send_comp(xrc_client, &wc) <= 0 ||
        wc.status != IBV_WC_SUCCESS)
        return fail("send");
    if (rdma_get_recv_comp(srv, &wc) <= 0 || wc.status != IBV_WC_SUCCESS ||
        wc.qp_num != srv->qp->qp_num || memcmp(got, msg, sizeof msg)) {
        printf("the SEND did not land in the SRQ (status %d)\n", wc.status);
        return 1;
    }
    /* The server's end goes first: a synchronous disconnect waits for its peer's answer,
     * which a synchronous id no thread calls on gives only when it is destroyed. */
    rdma_dereg_mr(mr);
    rdma_destroy_ep(srv);
    if (rdma_disconnect(xrc_client))
        return fail("disconnect");
    rdma_destroy_ep(xrc_client);
    rdma_destroy_ep(listener);
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    if (argc > 2 && !strcmp(argv[2], "late-get"))
        return late_get();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7479)};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (argc > 2 && !strcmp(argv[2], "late-ack"))
        return late_ack(&a);
    if (argc > 2 && !strcmp(argv[2], "params"))
        return params(&a);
    if (argc > 2 && !strcmp(argv[2], "exit-server"))
        return exit_server(&a);
    if (argc > 2 && !strcmp(argv[2], "exit-client"))
        return exit_client(&a);
    if (argc > 2 && !strcmp(argv[2], "taken-qp"))
        return taken_qp(&a);
    if (argc > 2 && !strcmp(argv[2], "xrc-ep"))
        return xrc_ep(argv[1]);

    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *listener;
    if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
        return fail("listener id");
    if (rdma_bind_addr(listener, (struct sockaddr *)&a) || rdma_listen(listener, 4))
        return fail("listen");

    /* A synchronous id (no channel): each call waits for its own event. */
    if (rdma_create_id(NULL, &client, NULL, RDMA_PS_TCP))
        return fail("client id");
    if (rdma_resolve_addr(client, NULL, (struct sockaddr *)&a, 2000))
        return fail("resolve_addr");
    if (rdma_resolve_route(client, 2000))
        return fail("resolve_route");
    struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                          .max_send_sge = 1, .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC};
    if (rdma_create_qp(client, NULL, &qa))
        return fail("create_qp");

    pthread_t t;
    pthread_create(&t, NULL, connect_thread, NULL);

    /* The request arrives; it stays unanswered while this thread calls on the client id. */
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev))
        return fail("get_cm_event");
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        printf("expected a connection request, got %s\n", rdma_event_str(ev->event));
        return 1;
    }
    struct rdma_cm_id *req = ev->id;
    rdma_ack_cm_event(ev);
    for (int i = 0; i < 1000; i++) {
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT};
        int mask = 0;
        if (rdma_init_qp_attr(client, &attr, &mask))
            return fail("init_qp_attr during the wait");
        uint8_t tos = 0;
        if (rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos))
            return fail("set_option during the wait");
    }
    if (atomic_load(&connect_done)) {
        printf("rdma_connect returned (%d) before its request was answered\n", connect_ret);
        return 1;
    }
    if (rdma_reject(req, NULL, 0))
        return fail("reject");
    pthread_join(t, NULL);
    if (connect_ret != -1 || connect_errno != ECONNREFUSED) {
        printf("rdma_connect: %d, errno %d (%s); expected ECONNREFUSED\n", connect_ret,
               connect_errno, strerror(connect_errno));
        return 1;
    }
    rdma_destroy_qp(client);
    rdma_destroy_id(client);
    rdma_destroy_id(req);
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
