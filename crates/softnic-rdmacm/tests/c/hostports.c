/* Two ports of 127.0.0.1, the host, served by two processes (two devices), and a third that
 * asks both in turn over one datagram rsocket:
 *   hostports serve <port> <tag>: answers 10 datagrams with <tag>, says "ok";
 *   hostports ask <port1> <tag1> <port2> <tag2>: sends to 127.0.0.1:<port1> and :<port2> in
 *   turn, 10 times each; each answer must be its port's tag, from 127.0.0.1 and that port
 *   (each port its own device: not the first one asked); says "ok".
 * Exits 1, saying what went wrong, otherwise. */
#include "rcheck.h"

static void serve(int port, const char *tag) {
    int s = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(s >= 0);
    struct sockaddr_in any = at("0.0.0.0", port);
    CHECK(rbind(s, (struct sockaddr *)&any, sizeof any) == 0);
    printf("serving\n");
    fflush(stdout);
    char buf[16];
    for (int i = 0; i < 10; i++) {
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        wait_for(s, POLLIN);
        CHECK(rrecvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &len) > 0);
        CHECK(rsendto(s, tag, strlen(tag), 0, (struct sockaddr *)&from, len) ==
              (ssize_t)strlen(tag));
    }
    CHECK(rclose(s) == 0);
}

static void ask(int ports[2], const char *tags[2]) {
    int c = rsocket(AF_INET, SOCK_DGRAM, 0);
    CHECK(c >= 0);
    char buf[16];
    for (int i = 0; i < 20; i++) {
        struct sockaddr_in to = at("127.0.0.1", ports[i % 2]), from;
        socklen_t len = sizeof from;
        CHECK(rsendto(c, "?", 1, 0, (struct sockaddr *)&to, sizeof to) == 1);
        wait_for(c, POLLIN);
        ssize_t n = rrecvfrom(c, buf, sizeof buf - 1, 0, (struct sockaddr *)&from, &len);
        CHECK(n > 0);
        buf[n] = 0;
        if (strcmp(buf, tags[i % 2]) != 0) {
            printf("asked port %d, answered by %s\n", ports[i % 2], buf);
            exit(1);
        }
        CHECK(from.sin_addr.s_addr == to.sin_addr.s_addr && from.sin_port == to.sin_port);
    }
    CHECK(rclose(c) == 0);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "serve") == 0) {
        serve(atoi(argv[2]), argv[3]);
    } else if (argc == 6 && strcmp(argv[1], "ask") == 0) {
        int ports[2] = {atoi(argv[2]), atoi(argv[4])};
        const char *tags[2] = {argv[3], argv[5]};
        ask(ports, tags);
    } else {
        printf("usage: hostports serve <port> <tag> | ask <port1> <tag1> <port2> <tag2>\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}
