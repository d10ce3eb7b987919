/* What the rsocket C tests share: CHECK (says which check failed, and errno, then exits 1), an
 * IPv4 address and port, and a wait (rpoll, 10 s at most) for events on one rsocket. */
#ifndef RCHECK_H
#define RCHECK_H

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            printf("line %d: %s (errno %d: %s)\n", __LINE__, #cond, errno,            \
                   strerror(errno));                                                  \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static inline struct sockaddr_in at(const char *addr, int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, addr, &a.sin_addr);
    return a;
}

/* Waits (rpoll, 10 s at most) until `fd` reports one of `events`. */
static inline short wait_for(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    CHECK(rpoll(&p, 1, 10000) == 1);
    return p.revents;
}

#endif
