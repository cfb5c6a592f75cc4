/* The floor of a paced HTTP/1.1 token: a server that does nothing but what any paced
 * HTTP/1.1 server must do, in C, one thread, epoll.
 *
 * Each POST gets a chunked 200 (text/event-stream) at once, then, TTFT after the request
 * arrived and every ITL after that, one pre-made chat chunk (230 bytes of SSE event, the
 * size of llmsim's) as one send() per token per connection; the last token leaves with
 * "data: [DONE]" and the last chunk in the same send.  Tokens are due on a 2 ms grid, as
 * llmsim's step grid rounds them, so that all the connections' tokens of a grid tick
 * leave in one wake-up, as llmsim's engine step sends them.  The request's "max_tokens"
 * is the number of tokens.  GET /metrics answers llmsim's two counters
 * (vllm:generation_tokens_total, vllm:request_success_total), so that
 * benchmarks.scenarios.paced_cost measures it as it measures llmsim.
 *
 * It is what benchmarks.scenarios.paced_cost calls the floor: the CPU per token it shows
 * is what the kernel's send() of a token and the wake-ups cost on this machine, in the
 * same run as llmsim (issue 16: "one send per token per connection is the floor").
 *
 *     cc -O2 -o h1_pacer h1_pacer.c && ./h1_pacer PORT TTFT_MS ITL_MS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define GRID_NS 2000000LL
#define INPUT_SIZE 65536
#define BACKLOG_SIZE 262144
#define EVENTS 512

typedef struct {
    int fd;
    int streaming;         /* a response is in flight */
    long tokens_left;      /* of the response in flight */
    int64_t due;           /* when its next token leaves (ns, CLOCK_MONOTONIC) */
    size_t input_length;   /* bytes of the next request read so far */
    size_t backlog_length; /* bytes the kernel did not take yet */
    char input[INPUT_SIZE];
    char backlog[BACKLOG_SIZE];
} connection;

static connection **connections; /* by descriptor */
static int connection_slots, highest_fd;
static int64_t next_due = INT64_MAX; /* the earliest grid time a token is due (INT64_MAX: none) */
static int epoll_fd;
static int64_t ttft_ns, itl_ns;
static unsigned long long tokens_total, requests_total;

static const char HEAD[] = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                           "transfer-encoding: chunked\r\n\r\n";
static char token_chunk[512], last_chunk[640];
static size_t token_chunk_length, last_chunk_length;

static int64_t
now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* The grid time nearest ``at`` (llmsim's rounding). */
static int64_t
on_grid(int64_t at)
{
    return (at + GRID_NS / 2) / GRID_NS * GRID_NS;
}

static void
make_chunks(void)
{
    char event[256];
    int size = snprintf(event, sizeof(event),
                        "data: {\"id\":\"chatcmpl-0\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":"
                        "\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,"
                        "\"finish_reason\":null}]}");
    while (size < 228) {
        event[size++] = ' ';
    }
    event[size++] = '\n';
    event[size++] = '\n';
    token_chunk_length = (size_t)snprintf(token_chunk, sizeof(token_chunk), "%x\r\n%.*s\r\n", size, size, event);
    /* the last token, "data: [DONE]\n\n" (14 bytes) and the last chunk: one send */
    last_chunk_length = (size_t)snprintf(last_chunk, sizeof(last_chunk), "%se\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
                                         token_chunk);
}

static void
close_connection(connection *c)
{
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    connections[c->fd] = NULL;
    free(c);
}

/* Send ``data`` (after any backlog); 0, or -1 when the connection is gone. */
static int
send_data(connection *c, const char *data, size_t length)
{
    if (c->backlog_length == 0) {
        ssize_t sent = send(c->fd, data, length, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno != EAGAIN && errno != EINTR) {
                return -1;
            }
            sent = 0;
        }
        data += sent;
        length -= (size_t)sent;
        if (length == 0) {
            return 0;
        }
        struct epoll_event event = {.events = EPOLLIN | EPOLLOUT, .data.fd = c->fd};
        epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c->fd, &event);
    }
    if (c->backlog_length + length > BACKLOG_SIZE) {
        return -1; /* a client that does not read */
    }
    memcpy(c->backlog + c->backlog_length, data, length);
    c->backlog_length += length;
    return 0;
}

static int
send_backlog(connection *c)
{
    ssize_t sent = send(c->fd, c->backlog, c->backlog_length, MSG_NOSIGNAL);
    if (sent < 0) {
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    }
    memmove(c->backlog, c->backlog + sent, c->backlog_length - (size_t)sent);
    c->backlog_length -= (size_t)sent;
    if (c->backlog_length == 0) {
        struct epoll_event event = {.events = EPOLLIN, .data.fd = c->fd};
        epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c->fd, &event);
    }
    return 0;
}

static int
answer_metrics(connection *c)
{
    char body[256], page[512];
    int body_length = snprintf(body, sizeof(body),
                               "vllm:generation_tokens_total %llu\nvllm:request_success_total %llu\n", tokens_total,
                               requests_total);
    int length = snprintf(page, sizeof(page),
                          "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s", body_length,
                          body);
    return send_data(c, page, (size_t)length);
}

/* Take the requests complete in the input; 0, or -1 when the connection is to close. */
static int
take_requests(connection *c, int64_t arrived)
{
    while (!c->streaming) {
        c->input[c->input_length] = '\0';
        char *end = strstr(c->input, "\r\n\r\n");
        if (end == NULL) {
            return c->input_length + 1 >= INPUT_SIZE ? -1 : 0;
        }
        size_t head = (size_t)(end + 4 - c->input), body = 0;
        char *length = strcasestr(c->input, "\ncontent-length:");
        if (length != NULL && length < end) {
            body = (size_t)strtoul(length + 16, NULL, 10);
        }
        if (head + body >= INPUT_SIZE) {
            return -1;
        }
        if (c->input_length < head + body) {
            return 0;
        }
        char saved = c->input[head + body];
        c->input[head + body] = '\0';
        if (strncmp(c->input, "GET /metrics", 12) == 0) {
            if (answer_metrics(c) < 0) {
                return -1;
            }
        } else {
            char *tokens = strstr(c->input + head, "\"max_tokens\"");
            char *colon = tokens == NULL ? NULL : strchr(tokens, ':');
            long count = colon == NULL ? 16 : strtol(colon + 1, NULL, 10);
            c->tokens_left = count > 0 ? count : 1;
            c->streaming = 1;
            c->due = on_grid(arrived + ttft_ns);
            if (c->due < next_due) {
                next_due = c->due;
            }
            if (send_data(c, HEAD, sizeof(HEAD) - 1) < 0) {
                return -1;
            }
        }
        c->input[head + body] = saved;
        memmove(c->input, c->input + head + body, c->input_length - head - body);
        c->input_length -= head + body;
    }
    return 0;
}

static void
accept_all(int listener)
{
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0) {
            return;
        }
        if (fd >= connection_slots) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        connection *c = calloc(1, sizeof(connection));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        connections[fd] = c;
        if (fd > highest_fd) {
            highest_fd = fd;
        }
        struct epoll_event event = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    }
}

static void
read_from(connection *c, int64_t arrived)
{
    for (;;) {
        ssize_t got = recv(c->fd, c->input + c->input_length, INPUT_SIZE - 1 - c->input_length, 0);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
            close_connection(c);
            return;
        }
        if (got < 0) {
            return;
        }
        c->input_length += (size_t)got;
        if (take_requests(c, arrived) < 0) {
            close_connection(c);
            return;
        }
    }
}

/* Send every token due by ``now``; the next due time (INT64_MAX: none). */
static int64_t
send_due(int64_t now)
{
    int64_t next = INT64_MAX;
    for (int fd = 0; fd <= highest_fd; fd++) {
        connection *c = connections[fd];
        if (c == NULL || !c->streaming) {
            continue;
        }
        if (c->due <= now) {
            int last = --c->tokens_left == 0;
            tokens_total++;
            int failed = last ? send_data(c, last_chunk, last_chunk_length)
                              : send_data(c, token_chunk, token_chunk_length);
            if (failed) {
                close_connection(c);
                continue;
            }
            if (last) {
                requests_total++;
                c->streaming = 0;
                if (take_requests(c, now) < 0) {
                    close_connection(c);
                    continue;
                }
                if (!c->streaming) {
                    continue;
                }
            } else {
                c->due += itl_ns;
            }
        }
        if (on_grid(c->due) < next) {
            next = on_grid(c->due);
        }
    }
    return next;
}

int
main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT TTFT_MS ITL_MS\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    ttft_ns = (int64_t)(atof(argv[2]) * 1e6);
    itl_ns = (int64_t)(atof(argv[3]) * 1e6);
    connection_slots = 65536;
    connections = calloc((size_t)connection_slots, sizeof(connection *));
    make_chunks();
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&address, sizeof(address)) < 0 || listen(listener, 4096) < 0) {
        perror("h1_pacer: bind/listen");
        return 1;
    }
    epoll_fd = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listener, &event);
    struct epoll_event events[EVENTS];
    for (;;) {
        int64_t now = now_ns();
        int64_t next = next_due;
        int timeout = next == INT64_MAX ? -1 : next <= now ? 0 : (int)((next - now + 999999) / 1000000);
        int ready = epoll_wait(epoll_fd, events, EVENTS, timeout);
        now = now_ns();
        for (int i = 0; i < ready; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                accept_all(listener);
                continue;
            }
            connection *c = connections[fd];
            if (c == NULL) {
                continue;
            }
            if ((events[i].events & EPOLLOUT) && send_backlog(c) < 0) {
                close_connection(c);
                continue;
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                read_from(c, now);
            }
        }
        if (now >= next_due) {
            next_due = INT64_MAX; /* (take_requests lowers it for a request that arrives meanwhile) */
            int64_t after = send_due(now);
            if (after < next_due) {
                next_due = after;
            }
        }
    }
}
