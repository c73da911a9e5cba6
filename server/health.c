/* grpc.health.v1.Health/Check: SERVING while kilnd accepts work, NOT_SERVING
 * once it drains. The empty service name and "kiln.v1.Kiln" are known; any
 * other name is NOT_FOUND, as the health checking protocol specifies.
 * Watch is not registered, so it gets UNIMPLEMENTED (the protocol allows
 * that).
 */
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "server/server.h"

void kilnd_handle_health_check(kilnd_call *c, ProtobufCMessage *req) {
  const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
  const char *service = r->service ? r->service : "";
  if (service[0] != '\0' && strcmp(service, "kiln.v1.Kiln") != 0 &&
      strcmp(service, "grpc.health.v1.Health") != 0) {
    kilnd_call_fail(c, KILN_ENOTFOUND, "unknown service '%.128s'", service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = atomic_load(&c->srv->draining)
                    ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                    : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  kilnd_call_finish(c, &resp.base, 0, NULL);
}
