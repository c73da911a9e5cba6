/* The HTTP endpoint for Prometheus: GET /metrics on the loop thread.
 *
 * A deliberately small HTTP/1.0-style server: read one request head (at most
 * 8 KiB), answer /metrics with the text exposition, /healthz with "ok" (or
 * 503 while draining), anything else with 404, and close the connection.
 * It never blocks the loop and never grows with what a peer sends.
 *
 * Connections are served concurrently (libuv), each with a deadline of its
 * own: the request head must arrive within READ_MS of the accept and the
 * reply must be taken within WRITE_MS of the answer, else the connection is
 * closed. At most MAX_CONNS are open at once; at the limit a new connection
 * takes the place of the oldest one that has sent no request yet (idle
 * sockets cannot starve a scraper, which sends its request at once), and is
 * refused only when every open connection is being answered.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "common/alloc.h"
#include "server/server.h"

#define HEAD_MAX 8192
#define MAX_CONNS 64
#define READ_MS 5000   /* accept to a complete request head */
#define WRITE_MS 10000 /* answer to the reply taken by the peer */

typedef struct conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_write_t wreq;
  kilnd *srv;
  char head[HEAD_MAX];
  size_t len;
  char *reply;   /* header + body, kiln_malloc'd */
  bool answered; /* a reply is being written: not idle */
  bool closing;  /* conn_close ran; counted in nclosing until freed */
  int open_handles;
  struct conn *prev, *next; /* open connections, to close them at shutdown */
} conn;

typedef struct http {
  uv_tcp_t listener;
  bool listening, listener_closed;
  int nconns;   /* in the list, closing ones included */
  int nclosing; /* of those, closing: they no longer count against MAX_CONNS */
  conn *conns;
} http;

/* Freed when the listener and every connection have closed. */
static void maybe_free(kilnd *srv) {
  http *hs = srv->http;
  if (hs && hs->listener_closed && hs->conns == NULL) {
    kiln_free(hs);
    srv->http = NULL;
  }
}

static http *http_of(kilnd *srv) { return srv->http; }

/* ---- connections --------------------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h) {
  conn *c = h->data;
  if (--c->open_handles > 0) return;
  http *hs = http_of(c->srv);
  if (hs) {
    hs->nconns--;
    hs->nclosing--;
    if (c->prev)
      c->prev->next = c->next;
    else
      hs->conns = c->next;
    if (c->next) c->next->prev = c->prev;
  }
  kilnd *srv = c->srv;
  kiln_free(c->reply);
  kiln_free(c);
  maybe_free(srv);
}

static void conn_close(conn *c) {
  if (!c->closing) {
    c->closing = true;
    http *hs = http_of(c->srv);
    if (hs) hs->nclosing++;
  }
  if (!uv_is_closing((uv_handle_t *)&c->tcp)) uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  if (!uv_is_closing((uv_handle_t *)&c->timer)) uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

/* The read or the write deadline passed. */
static void on_deadline(uv_timer_t *t) { conn_close(t->data); }

static void on_written(uv_write_t *w, int status) {
  (void)status;
  conn_close(w->data);
}

static void respond(conn *c, int code, const char *reason, const char *type, const char *body,
                    size_t blen) {
  char head[256];
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                    "Connection: close\r\n\r\n",
                    code, reason, type, blen);
  c->reply = kiln_malloc((size_t)hl + blen);
  if (c->reply == NULL) {
    conn_close(c);
    return;
  }
  memcpy(c->reply, head, (size_t)hl);
  if (blen) memcpy(c->reply + hl, body, blen);
  uv_buf_t buf = uv_buf_init(c->reply, (unsigned)((size_t)hl + blen));
  c->wreq.data = c;
  c->answered = true;
  uv_timer_start(&c->timer, on_deadline, WRITE_MS, 0);
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0) conn_close(c);
}

static void answer(conn *c) {
  uv_read_stop((uv_stream_t *)&c->tcp);
  const char *text = "text/plain; charset=utf-8";
  bool get = strncmp(c->head, "GET ", 4) == 0;
  const char *path = get ? c->head + 4 : "";
  if (!get) {
    respond(c, 405, "Method Not Allowed", text, "only GET\n", 9);
  } else if (strncmp(path, "/metrics ", 9) == 0 || strncmp(path, "/metrics?", 9) == 0) {
    size_t len = 0;
    char *body = kilnd_metrics_render(c->srv, &len);
    if (body == NULL)
      respond(c, 500, "Internal Server Error", text, "out of memory\n", 14);
    else
      respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, len);
    kiln_free(body);
  } else if (strncmp(path, "/healthz ", 9) == 0) {
    if (atomic_load(&c->srv->draining))
      respond(c, 503, "Service Unavailable", text, "draining\n", 9);
    else
      respond(c, 200, "OK", text, "ok\n", 3);
  } else {
    respond(c, 404, "Not Found", text, "not found (try /metrics)\n", 25);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = h->data;
  *buf = uv_buf_init(c->head + c->len, (unsigned)(HEAD_MAX - 1 - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  conn *c = s->data;
  if (n < 0) {
    conn_close(c);
    return;
  }
  c->len += (size_t)n;
  c->head[c->len] = '\0';
  if (c->answered) return;
  if (strstr(c->head, "\r\n\r\n") || strstr(c->head, "\n\n"))
    answer(c);
  else if (c->len >= HEAD_MAX - 1) {
    uv_read_stop(s);
    respond(c, 431, "Request Header Fields Too Large", "text/plain", "too large\n", 10);
  }
}

/* Closes the oldest connection (other than keep) that has sent no
 * complete request; false when every one is being answered. */
static bool evict_idle(http *hs, const conn *keep) {
  conn *oldest = NULL;
  for (conn *c = hs->conns; c; c = c->next) /* newest first */
    if (c != keep && !c->answered && !c->closing) oldest = c;
  if (oldest == NULL) return false;
  conn_close(oldest);
  return true;
}

static void on_connection(uv_stream_t *listener, int status) {
  kilnd *srv = listener->data;
  http *hs = http_of(srv);
  if (status < 0) return;
  conn *c = kiln_calloc(1, sizeof *c);
  if (c == NULL) return;
  c->srv = srv;
  c->tcp.data = c->timer.data = c;
  uv_tcp_init(listener->loop, &c->tcp);
  uv_timer_init(listener->loop, &c->timer);
  c->open_handles = 2;
  hs->nconns++;
  c->next = hs->conns;
  if (hs->conns) hs->conns->prev = c;
  hs->conns = c;
  if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
    conn_close(c);
    return;
  }
  if (hs->nconns - hs->nclosing > MAX_CONNS && !evict_idle(hs, c)) {
    conn_close(c);
    return;
  }
  uv_timer_start(&c->timer, on_deadline, READ_MS, 0);
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) conn_close(c);
}

/* ---- the listener -------------------------------------------------------------------- */

/* "HOST:PORT" or "[V6]:PORT" into addr. */
static int parse_addr(const char *spec, struct sockaddr_storage *addr, char *host, size_t hsize,
                      kiln_status *st) {
  const char *colon = strrchr(spec, ':');
  if (colon == NULL || colon == spec)
    return kiln_status_set(st, KILN_EINVAL, "metrics-listen", "'%s' is not HOST:PORT", spec);
  size_t hl = (size_t)(colon - spec);
  if (spec[0] == '[' && hl >= 2 && spec[hl - 1] == ']')
    snprintf(host, hsize, "%.*s", (int)hl - 2, spec + 1);
  else
    snprintf(host, hsize, "%.*s", (int)hl, spec);
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535 || colon[1] == '\0')
    return kiln_status_set(st, KILN_EINVAL, "metrics-listen", "bad port in '%s'", spec);
  if (strcmp(host, "localhost") == 0) snprintf(host, hsize, "127.0.0.1");
  if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)addr) == 0) return 0;
  if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)addr) == 0) return 0;
  return kiln_status_set(st, KILN_EINVAL, "metrics-listen", "'%s' is not a numeric address", host);
}

int kilnd_http_start(kilnd *srv, void *uv_loop, kiln_status *st) {
  if (strcmp(srv->cfg.metrics_listen, "off") == 0 || srv->cfg.metrics_listen[0] == '\0') return 0;
  struct sockaddr_storage addr;
  char host[128];
  int rc = parse_addr(srv->cfg.metrics_listen, &addr, host, sizeof host, st);
  if (rc) return rc;
  http *hs = kiln_calloc(1, sizeof *hs);
  if (hs == NULL) return kiln_status_set(st, KILN_ENOMEM, "metrics-listen", "out of memory");
  srv->http = hs;
  uv_tcp_init(uv_loop, &hs->listener);
  hs->listener.data = srv;
  hs->listening = true;
  int e = uv_tcp_bind(&hs->listener, (const struct sockaddr *)&addr, 0);
  if (e == 0) e = uv_listen((uv_stream_t *)&hs->listener, 64, on_connection);
  if (e)
    return kiln_status_set(st, KILN_EIO, "metrics-listen", "cannot listen on %s: %s",
                           srv->cfg.metrics_listen, uv_strerror(e));
  struct sockaddr_storage bound;
  int blen = sizeof bound;
  uv_tcp_getsockname(&hs->listener, (struct sockaddr *)&bound, &blen);
  int port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&bound)->sin_port);
  printf("kilnd: metrics listening on %s%s%s:%d\n", strchr(host, ':') ? "[" : "", host,
         strchr(host, ':') ? "]" : "", port);
  fflush(stdout);
  return 0;
}

static void on_listener_closed(uv_handle_t *h) {
  kilnd *srv = h->data;
  http_of(srv)->listener_closed = true;
  maybe_free(srv);
}

void kilnd_http_close(kilnd *srv) {
  http *hs = http_of(srv);
  if (hs == NULL || !hs->listening) return;
  hs->listening = false;
  for (conn *c = hs->conns; c; c = c->next) conn_close(c);
  uv_close((uv_handle_t *)&hs->listener, on_listener_closed);
}
