/* kilnd's transport security and caller identity: TLS credentials for the
 * gRPC port (reloaded on SIGHUP), the bearer-token table and its roles, and
 * the plaintext health-only port.
 *
 * - TLS (--tls-cert, --tls-key; --tls-client-ca requires and verifies
 *   client certificates) uses the gRPC core's SSL server credentials built
 *   from options with a certificate-config fetcher: the core asks the
 *   fetcher at each new handshake, so certificates read again on SIGHUP
 *   serve new connections while established ones (and their calls) go on.
 * - Tokens (--tokens FILE): lines `sha256:<64 hex> CLIENT ROLE`, ROLE user or
 *   admin. A call carries `authorization: Bearer TOKEN`; its SHA-256 is
 *   compared with every entry in constant time. With tokens the identity is
 *   the entry's client name; with verified client certificates and no
 *   tokens it is the certificate's subject; otherwise it is the
 *   `kiln-client` metadata as before (no authentication).
 * - The health port (--health-listen) is a second plaintext port of the
 *   same server whose calls are marked by an auth metadata processor, so
 *   the validation point serves only grpc.health.v1 there.
 */
#ifndef KILN_SERVER_AUTH_H
#define KILN_SERVER_AUTH_H

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "common/status.h"

typedef struct kilnd kilnd;
typedef struct kilnd_call kilnd_call;
typedef struct kilnd_auth kilnd_auth;

typedef enum kilnd_role {
  KILND_ROLE_OPEN = 0, /* no tokens configured: every call allowed */
  KILND_ROLE_USER,
  KILND_ROLE_ADMIN,
} kilnd_role;

/* Server-local status codes for the two refusals (call.c maps them). */
#define KILND_EUNAUTH (-101) /* UNAUTHENTICATED */
#define KILND_EPERM (-102)   /* PERMISSION_DENIED */

/* Reads the token file and the certificate files named by srv->cfg.
 * A malformed token line is KILN_EINVAL naming FILE:LINE. */
int kilnd_auth_create(kilnd *srv, kiln_status *st);
void kilnd_auth_destroy(kilnd *srv);

/* Credentials for the main port (TLS or plaintext); the caller releases
 * them after adding the port. NULL with st set on failure. */
grpc_server_credentials *kilnd_auth_main_credentials(kilnd *srv, kiln_status *st);
/* Plaintext credentials for the health port, marking its calls. */
grpc_server_credentials *kilnd_auth_health_credentials(kilnd *srv);

/* SIGHUP (loop thread): reads the certificate files again (the next
 * handshake uses them) and the token file (the next call is checked
 * against it). A file that fails to load is logged and the old
 * certificates or tokens stay. Tokens cannot be turned on or off by a
 * reload: that needs a restart with or without --tokens. */
void kilnd_auth_reload(kilnd *srv);
/* Hands the token file's per-token quotas to the buffer store and the
 * scheduler (at start, once both exist; a reload does it itself). */
int kilnd_auth_apply_quotas(kilnd *srv, kiln_status *st);

/* The validation point's identity step: sets c->client and c->role, or
 * fails with KILND_EUNAUTH (token missing or unknown), KILN_EUNIMPL (a
 * non-health method on the health port) or KILN_EINVAL (bad kiln-client
 * value). Never blocks. */
int kilnd_auth_identify(kilnd_call *c, kiln_status *st);

#endif /* KILN_SERVER_AUTH_H */
