/* rsockets as a socket program uses them, a listener and a client in one process on the device
 * at <address> (rsock <address>):
 * - refused before anything is sent: a number that is no rsocket (EBADF), an option no
 *   rsocket has (ENOPROTOOPT);
 * - a blocking connect to a port nobody listens on fails with ECONNREFUSED;
 * - a non-blocking accept with nothing waiting fails with EAGAIN; a non-blocking connect says
 *   EINPROGRESS, then rpoll reports the request (listener) and the connection (POLLOUT), and
 *   SO_ERROR is 0; the names of both ends agree;
 * - nothing to read: EAGAIN, and rpoll times out with 0;
 * - non-blocking sends take until the peer's slots are full (EAGAIN), and all of it is read
 *   back in order, unchanged;
 * - MSG_PEEK leaves data unread; rwritev/rreadv gather and scatter; rselect sees a readable
 *   rsocket;
 * - riomap: the peer's riowrites land in the mapped buffer, unchanged, before a message sent
 *   after them; a write past the mapping, a mapping with flags, an unmapped buffer and a
 *   write after riounmap fail with EINVAL;
 * - rshutdown(SHUT_WR): the peer reads what was sent, then 0; it can still send back; a send
 *   after it fails with EPIPE (no SIGPIPE);
 * - the peer's last data and rclose: no POLLHUP until that data is read, then POLLHUP and the
 *   end of the stream; two ends that both sent more than the other read both close;
 * - datagrams (SOCK_DGRAM) between two sockets of this thread: a send before connect fails
 *   with EDESTADDRREQ, one longer than a datagram (4048 bytes) with EMSGSIZE, a listen with
 *   EOPNOTSUPP; the longest datagram arrives whole; a datagram arrives whole once (a shorter
 *   read truncates it) from the sender's address, and the reply to that address arrives; a send
 *   to a port nobody serves fails with ECONNREFUSED; a connected socket does not see (rpoll)
 *   another's datagrams; rrecvmsg names the source; a server made again on its port is
 *   reached once its first datagram came;
 * - 127.0.0.1, the host (see host_datagrams).
 * Prints "ok" and exits 0 on success; says what went wrong otherwise. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/uio.h>

#include "rcheck.h"

/* Reads exactly `len` bytes (blocking socket). */
static void read_all(int fd, unsigned char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = rrecv(fd, buf + got, len - got, 0);
        CHECK(n > 0);
        got += n;
    }
}

static void datagrams(const char *addr) {
    unsigned char buf[64];
    int s = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(s >= 0);
    struct sockaddr_in sa = at(addr, 7393);
    CHECK(rbind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    int c = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(c >= 0);
    CHECK(rlisten(c, 1) == -1 && errno == EOPNOTSUPP);
    CHECK(rsend(c, "x", 1, 0) == -1 && errno == EDESTADDRREQ);
    CHECK(rconnect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    static char big[8192];
    CHECK(rsend(c, big, 4049, 0) == -1 && errno == EMSGSIZE);
    /* The longest datagram (a 4096-byte MTU, less the GRH and rsocket's header). */
    for (size_t i = 0; i < 4048; i++)
        big[i] = (char)(i * 13);
    CHECK(rsend(c, big, 4048, 0) == 4048);
    CHECK(rrecv(s, big + 4096, 4096, 0) == 4048 && memcmp(big, big + 4096, 4048) == 0);
    CHECK(rsend(c, "ping", 4, 0) == 4);
    struct sockaddr_in from, cname;
    socklen_t flen = sizeof from, clen = sizeof cname;
    CHECK(rrecvfrom(s, buf, 2, 0, (struct sockaddr *)&from, &flen) == 2);
    CHECK(memcmp(buf, "pi", 2) == 0 && flen == sizeof from);
    CHECK(rgetsockname(c, (struct sockaddr *)&cname, &clen) == 0);
    CHECK(from.sin_port == cname.sin_port && from.sin_addr.s_addr == sa.sin_addr.s_addr);
    CHECK(rsendto(s, "pong", 4, 0, (struct sockaddr *)&from, flen) == 4);
    CHECK(rrecv(c, buf, sizeof buf, 0) == 4 && memcmp(buf, "pong", 4) == 0);
    CHECK(rfcntl(s, F_SETFL, O_NONBLOCK) == 0);
    CHECK(rrecv(s, buf, sizeof buf, 0) == -1 && errno == EAGAIN);
    CHECK(wait_for(s, POLLOUT) == POLLOUT);
    struct sockaddr_in nobody = at(addr, 7394);
    CHECK(rsendto(c, "x", 1, 0, (struct sockaddr *)&nobody, sizeof nobody) == -1 &&
          errno == ECONNREFUSED);

    /* A connected socket takes its peer's datagrams only: another's is not even readable. */
    int x = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(x >= 0 && rsendto(x, "no", 2, 0, (struct sockaddr *)&cname, clen) == 2);
    struct pollfd p = {.fd = c, .events = POLLIN};
    CHECK(rpoll(&p, 1, 200) == 0);
    CHECK(rclose(x) == 0);

    /* rrecvmsg names the source. */
    CHECK(rsend(c, "msg", 3, 0) == 3);
    CHECK(wait_for(s, POLLIN) & POLLIN);
    struct sockaddr_in name;
    struct iovec iov = {buf, sizeof buf};
    struct msghdr m = {.msg_name = &name, .msg_namelen = sizeof name, .msg_iov = &iov,
                       .msg_iovlen = 1};
    CHECK(rrecvmsg(s, &m, 0) == 3 && m.msg_namelen == sizeof name);
    CHECK(name.sin_port == cname.sin_port && memcmp(buf, "msg", 3) == 0);

    /* The server made again on its port (another QP): its first datagram moves the client's
     * route, and the client's next ones reach it. */
    CHECK(rclose(s) == 0);
    s = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(s >= 0 && rbind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(rsendto(s, "new", 3, 0, (struct sockaddr *)&cname, clen) == 3);
    CHECK(rrecv(c, buf, sizeof buf, 0) == 3 && memcmp(buf, "new", 3) == 0);
    CHECK(rsend(c, "back", 4, 0) == 4);
    CHECK(wait_for(s, POLLIN) & POLLIN);
    CHECK(rrecv(s, buf, sizeof buf, 0) == 4 && memcmp(buf, "back", 4) == 0);
    CHECK(rclose(c) == 0 && rclose(s) == 0);
}

/* Sends a datagram from `c` to `to`, where `server` receives it and answers `reply` (two
 * bytes): the address the answer came from. */
static struct sockaddr_in ask(int c, struct sockaddr_in to, int server, const char *reply) {
    unsigned char buf[16];
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    CHECK(rsendto(c, "?", 1, 0, (struct sockaddr *)&to, sizeof to) == 1);
    CHECK(rrecvfrom(server, buf, sizeof buf, 0, (struct sockaddr *)&from, &flen) == 1);
    CHECK(rsendto(server, reply, 2, 0, (struct sockaddr *)&from, flen) == 2);
    flen = sizeof from;
    CHECK(rrecvfrom(c, buf, sizeof buf, 0, (struct sockaddr *)&from, &flen) == 2);
    CHECK(memcmp(buf, reply, 2) == 0);
    return from;
}

/* 127.0.0.1, the host: a datagram socket bound to the any address is reached there, and its
 * answers come from 127.0.0.1 and that port, while another socket of the same device, sent to
 * at its own address, answers from there; a socket connected to 127.0.0.1 takes its answers;
 * an AF_INET6 socket bound to ::1 (the host too) is named ::1. */
static void host_datagrams(const char *addr) {
    unsigned char buf[16];
    int any = rsocket(AF_INET, SOCK_DGRAM, 0), own = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(any >= 0 && own >= 0);
    struct sockaddr_in anywhere = at("0.0.0.0", 7395), lo = at("127.0.0.1", 7395);
    struct sockaddr_in own_at = at(addr, 7396);
    CHECK(rbind(any, (struct sockaddr *)&anywhere, sizeof anywhere) == 0);
    CHECK(rbind(own, (struct sockaddr *)&own_at, sizeof own_at) == 0);
    int c = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(c >= 0);
    struct sockaddr_in from = ask(c, lo, any, "r1");
    CHECK(from.sin_addr.s_addr == lo.sin_addr.s_addr && from.sin_port == lo.sin_port);
    from = ask(c, own_at, own, "r2");
    CHECK(from.sin_addr.s_addr == own_at.sin_addr.s_addr && from.sin_port == own_at.sin_port);
    int d = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(d >= 0 && rconnect(d, (struct sockaddr *)&lo, sizeof lo) == 0);
    CHECK(rsend(d, "h3", 2, 0) == 2);
    socklen_t flen = sizeof from;
    CHECK(rrecvfrom(any, buf, sizeof buf, 0, (struct sockaddr *)&from, &flen) == 2);
    CHECK(rsendto(any, "r3", 2, 0, (struct sockaddr *)&from, flen) == 2);
    CHECK(wait_for(d, POLLIN) & POLLIN);
    CHECK(rrecv(d, buf, sizeof buf, 0) == 2 && memcmp(buf, "r3", 2) == 0);
    int v6 = rsocket(AF_INET6, SOCK_DGRAM, 0);
    CHECK(v6 >= 0);
    struct sockaddr_in6 lo6, name6;
    memset(&lo6, 0, sizeof lo6);
    lo6.sin6_family = AF_INET6;
    lo6.sin6_port = htons(7397);
    lo6.sin6_addr = in6addr_loopback;
    CHECK(rbind(v6, (struct sockaddr *)&lo6, sizeof lo6) == 0);
    socklen_t nlen = sizeof name6;
    CHECK(rgetsockname(v6, (struct sockaddr *)&name6, &nlen) == 0);
    CHECK(nlen == sizeof name6 && name6.sin6_family == AF_INET6);
    CHECK(memcmp(&name6.sin6_addr, &in6addr_loopback, sizeof name6.sin6_addr) == 0);
    CHECK(rclose(v6) == 0 && rclose(d) == 0 && rclose(c) == 0);
    CHECK(rclose(own) == 0 && rclose(any) == 0);
}

/* Sends from `from` until nothing more goes (no room for 200 ms: the peer's slots are full,
 * and so are this end's). */
static void fill(int from) {
    static char junk[1 << 16];
    CHECK(rfcntl(from, F_SETFL, O_NONBLOCK) == 0);
    struct pollfd p = {.fd = from, .events = POLLOUT};
    for (int i = 0;; i++) {
        CHECK(i < 100000);
        if (rsend(from, junk, sizeof junk, 0) < 0) {
            CHECK(errno == EAGAIN);
            if (rpoll(&p, 1, 200) == 0)
                break;
        }
    }
}

/* Two ends that both sent more than the other read, then close: neither waits for the
 * other to read (that would be for ever). The second close finds the first's disconnect. */
static void both_close_unread(int l, struct sockaddr_in *la) {
    int c = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    CHECK(c >= 0 && rconnect(c, (struct sockaddr *)la, sizeof *la) == -1);
    /* One thread: the connect goes on as rpoll looks at both ends. */
    struct pollfd p[2] = {{.fd = l, .events = POLLIN}, {.fd = c, .events = POLLOUT}};
    while (!(p[0].revents & POLLIN))
        CHECK(rpoll(p, 2, 10000) > 0);
    int a = raccept(l, NULL, NULL);
    CHECK(a >= 0 && wait_for(c, POLLOUT) == POLLOUT && wait_for(a, POLLOUT) == POLLOUT);
    fill(c);
    fill(a);
    CHECK(rclose(a) == 0);
    CHECK(rclose(c) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *addr = argv[1];
    int one = 1;

    datagrams(addr);
    host_datagrams(addr);
    CHECK(rclose(12345) == -1 && errno == EBADF);
    CHECK(rsend(0, "x", 1, 0) == -1 && errno == EBADF);

    int c = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    struct sockaddr_in none = at(addr, 7390);
    CHECK(rconnect(c, (struct sockaddr *)&none, sizeof none) == -1 && errno == ECONNREFUSED);
    CHECK(rclose(c) == 0);

    int l = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    CHECK(rsetsockopt(l, SOL_SOCKET, SO_BROADCAST, &one, sizeof one) == -1 &&
          errno == ENOPROTOOPT);
    struct sockaddr_in la = at(addr, 7391);
    CHECK(rbind(l, (struct sockaddr *)&la, sizeof la) == 0);
    CHECK(rlisten(l, 4) == 0);
    CHECK(rfcntl(l, F_SETFL, O_NONBLOCK) == 0);
    CHECK(raccept(l, NULL, NULL) == -1 && errno == EAGAIN);

    c = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    CHECK(rfcntl(c, F_SETFL, O_NONBLOCK) == 0);
    CHECK(rfcntl(c, F_GETFL) & O_NONBLOCK);
    CHECK(rconnect(c, (struct sockaddr *)&la, sizeof la) == -1 && errno == EINPROGRESS);
    /* The client's connect goes on as rpoll looks at it. */
    for (int i = 0;; i++) {
        struct pollfd p[2] = {{.fd = l, .events = POLLIN}, {.fd = c, .events = POLLOUT}};
        CHECK(i < 100 && rpoll(p, 2, 100) >= 0);
        if (p[0].revents & POLLIN)
            break;
    }
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    int a = raccept(l, (struct sockaddr *)&peer, &plen);
    CHECK(a >= 0 && plen == sizeof peer);
    CHECK(wait_for(c, POLLOUT) == POLLOUT);
    int err = -1;
    socklen_t elen = sizeof err;
    CHECK(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0);
    struct sockaddr_in cname, cpeer;
    socklen_t n1 = sizeof cname, n2 = sizeof cpeer;
    CHECK(rgetsockname(c, (struct sockaddr *)&cname, &n1) == 0);
    CHECK(rgetpeername(c, (struct sockaddr *)&cpeer, &n2) == 0);
    CHECK(cpeer.sin_port == la.sin_port && cpeer.sin_addr.s_addr == la.sin_addr.s_addr);
    CHECK(cname.sin_port != 0 && cname.sin_port == peer.sin_port);

    unsigned char buf[1 << 16];
    CHECK(rrecv(a, buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    struct pollfd q = {.fd = a, .events = POLLIN};
    CHECK(rpoll(&q, 1, 50) == 0);

    /* Non-blocking sends until the peer's slots are full. */
    static unsigned char pattern[1 << 16];
    for (size_t i = 0; i < sizeof pattern; i++)
        pattern[i] = (unsigned char)(i * 7 + i / 256);
    size_t sent = 0;
    for (int i = 0;; i++) {
        CHECK(i < 100000);
        ssize_t n = rsend(c, pattern + sent % sizeof pattern,
                          sizeof pattern - sent % sizeof pattern, 0);
        if (n < 0) {
            CHECK(errno == EAGAIN);
            if (sent >= 4 * sizeof pattern)
                break;
            continue;
        }
        sent += n;
    }
    CHECK(sent < (64u << 20));
    for (size_t got = 0; got < sent;) {
        size_t want = sizeof pattern - got % sizeof pattern;
        if (want > sent - got)
            want = sent - got;
        read_all(a, buf, want);
        CHECK(memcmp(buf, pattern + got % sizeof pattern, want) == 0);
        got += want;
    }

    CHECK(rsend(c, "hello", 5, 0) == 5);
    CHECK(rrecv(a, buf, 3, MSG_PEEK) == 3 && memcmp(buf, "hel", 3) == 0);
    CHECK(rrecv(a, buf, 5, MSG_WAITALL) == 5 && memcmp(buf, "hello", 5) == 0);

    struct iovec out[3] = {{"ab", 2}, {"cde", 3}, {"f", 1}};
    CHECK(rwritev(c, out, 3) == 6);
    char x[4], y[2];
    struct iovec in[2] = {{x, 4}, {y, 2}};
    CHECK(wait_for(a, POLLIN) == POLLIN);
    CHECK(rreadv(a, in, 2) == 6 && memcmp(x, "abcd", 4) == 0 && memcmp(y, "ef", 2) == 0);

    static unsigned char mapped[3 << 16];
    CHECK(riomap(a, mapped, sizeof mapped, PROT_WRITE, 1, 0) == -1 && errno == EINVAL);
    CHECK(riomap(a, mapped, sizeof mapped, PROT_WRITE, 0, -1) == 0);
    CHECK(rsend(a, "m", 1, 0) == 1);
    CHECK(wait_for(c, POLLIN) & POLLIN);
    CHECK(rrecv(c, buf, 1, 0) == 1 && buf[0] == 'm');
    CHECK(riowrite(c, pattern, 10, sizeof mapped - 5, 0) == (size_t)-1 && errno == EINVAL);
    for (size_t w = 0; w < sizeof mapped;) {
        size_t at = w % sizeof pattern;
        size_t n = riowrite(c, pattern + at, sizeof pattern - at, w, 0);
        if (n == (size_t)-1) {
            CHECK(errno == EAGAIN);
            continue;
        }
        w += n;
    }
    while (rsend(c, "d", 1, 0) != 1)
        CHECK(errno == EAGAIN);
    CHECK(rrecv(a, buf, 1, 0) == 1 && buf[0] == 'd');
    for (size_t i = 0; i < sizeof mapped; i += sizeof pattern)
        CHECK(memcmp(mapped + i, pattern, sizeof pattern) == 0);
    CHECK(riounmap(a, mapped, sizeof mapped) == 0);
    CHECK(riounmap(a, mapped, sizeof mapped) == -1 && errno == EINVAL);
    CHECK(rsend(a, "u", 1, 0) == 1);
    CHECK(wait_for(c, POLLIN) & POLLIN);
    CHECK(rrecv(c, buf, 1, 0) == 1 && buf[0] == 'u');
    CHECK(riowrite(c, "x", 1, 0, 0) == (size_t)-1 && errno == EINVAL);

    CHECK(rsend(c, "z", 1, 0) == 1);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(a, &rd);
    struct timeval tv = {.tv_sec = 10};
    CHECK(rselect(a + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(a, &rd));

    CHECK(rshutdown(c, SHUT_WR) == 0);
    CHECK(rrecv(a, buf, sizeof buf, 0) == 1 && buf[0] == 'z');
    CHECK(rrecv(a, buf, sizeof buf, 0) == 0);
    CHECK(rsend(a, "back", 4, 0) == 4);
    CHECK(wait_for(c, POLLIN) & POLLIN);
    CHECK(rrecv(c, buf, sizeof buf, 0) == 4 && memcmp(buf, "back", 4) == 0);
    CHECK(rsend(c, "late", 4, 0) == -1 && errno == EPIPE);

    /* The peer's last data, then its close: no POLLHUP while that data is unread (a reader
     * that stops at POLLHUP, as rstream's, would lose it), then POLLHUP and the end. */
    CHECK(rsend(a, "bye", 3, 0) == 3);
    CHECK(rclose(a) == 0);
    for (int i = 0; i < 20; i++)
        CHECK(!(wait_for(c, POLLIN) & POLLHUP));
    CHECK(rfcntl(c, F_SETFL, 0) == 0);
    CHECK(rrecv(c, buf, sizeof buf, 0) == 3 && memcmp(buf, "bye", 3) == 0);
    for (int i = 0; !(wait_for(c, POLLIN) & POLLHUP); i++)
        CHECK(i < 1000);
    CHECK(rrecv(c, buf, sizeof buf, 0) == 0);
    CHECK(rclose(c) == 0);
    both_close_unread(l, &la);
    CHECK(rclose(l) == 0);
    printf("ok\n");
    return 0;
}
