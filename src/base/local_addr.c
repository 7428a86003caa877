/* The address a rank publishes to its peers and listens on (sock.h):
 * DDP_TCP_HOST, else an interface chosen by name (DDP_SOCKET_IFNAME, as
 * GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME choose one on hosts with several
 * networks), else the host name's address, else loopback; IPv4 or IPv6 as
 * DDP_SOCKET_FAMILY says. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/sock.h"

enum { FAM_ANY, FAM_V4, FAM_V6 }; /* DDP_SOCKET_FAMILY's words, in order */

/* Does interface `name` match one comma-separated entry list?  An entry is
 * a prefix ("eth" matches eth0), "=name" an exact name, "^prefix" or
 * "^=name" an exclusion; a list of exclusions alone admits every other
 * interface. */
static int ifname_selected(const char *list, const char *name)
{
    int any_include = 0, included = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int exclude = p[0] == '^';
        int exact = p[exclude] == '='; /* "=eth0", or "^=docker0" (NCCL's) */
        const char *e = p + exclude + exact;
        size_t en = n > (size_t)(exclude + exact) ? n - (size_t)(exclude + exact) : 0;
        int hit = en > 0 && (exact ? strlen(name) == en && strncmp(name, e, en) == 0
                                   : strncmp(name, e, en) == 0);
        if (exclude && hit)
            return 0;
        if (!exclude) {
            any_include = 1;
            included |= hit;
        }
        p += n + (p[n] == ',');
    }
    return any_include ? included : 1;
}

/* A usable address: up, and not an IPv6 link-local one (fe80::/10 needs
 * a scope id that peers on other hosts cannot use). */
static int usable(const struct ifaddrs *ifa, int family)
{
    if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP) || ifa->ifa_addr->sa_family != family)
        return 0;
    if (family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr;
        return !IN6_IS_ADDR_LINKLOCAL(a);
    }
    return 1;
}

static void addr_ip(const struct sockaddr *sa, char *out, size_t len)
{
    const void *a = sa->sa_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (!inet_ntop(sa->sa_family, a, out, (socklen_t)len))
        snprintf(out, len, "?");
}

/* "lo (127.0.0.1, ::1), eth0 (10.0.0.2)": every interface with an address,
 * for the message when nothing matched. */
static void list_interfaces(const struct ifaddrs *all, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    const char *last = NULL;
    for (const struct ifaddrs *ifa = all; ifa && used + 1 < len; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr ||
            (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6))
            continue;
        char ip[INET6_ADDRSTRLEN];
        addr_ip(ifa->ifa_addr, ip, sizeof ip);
        int same = last && strcmp(last, ifa->ifa_name) == 0;
        int n = snprintf(out + used, len - used, "%s%s%s%s%s", same ? ", " : used ? "), " : "",
                         same ? "" : ifa->ifa_name, same ? "" : " (", ip,
                         (ifa->ifa_flags & IFF_UP) ? "" : " down");
        used += n > 0 ? (size_t)n : 0;
        last = ifa->ifa_name;
    }
    if (used && used + 1 < len)
        snprintf(out + used, len - used, ")");
}

static int from_ifname(const char *list, int fam, char *out, size_t len)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "DDP_SOCKET_IFNAME=%s: getifaddrs", list);
    int families[2] = {fam == FAM_V6 ? AF_INET6 : AF_INET, fam == FAM_ANY ? AF_INET6 : 0};
    for (int f = 0; f < 2 && families[f]; f++)
        for (struct ifaddrs *ifa = all; ifa; ifa = ifa->ifa_next)
            if (usable(ifa, families[f]) && ifname_selected(list, ifa->ifa_name)) {
                addr_ip(ifa->ifa_addr, out, len);
                freeifaddrs(all);
                return 0;
            }
    char have[512];
    list_interfaces(all, have, sizeof have);
    freeifaddrs(all);
    return DDP_ERROR(DDP_ERR_NOT_FOUND,
                     "DDP_SOCKET_IFNAME=%s: no interface that is up matches it with an %s "
                     "address (interfaces here: %s)",
                     list, fam == FAM_V4 ? "IPv4" : fam == FAM_V6 ? "IPv6" : "IPv4 or IPv6",
                     have[0] ? have : "none");
}

/* The first address of the host's name in family af; 0 if there is one. */
static int from_hostname(int af, char *out, size_t len)
{
    char name[256];
    if (gethostname(name, sizeof name) != 0)
        return -1;
    name[sizeof name - 1] = '\0';
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = af;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(name, NULL, &hints, &res) != 0)
        return -1;
    int rc = -1;
    for (struct addrinfo *ai = res; ai && rc != 0; ai = ai->ai_next)
        if (ai->ai_family == af) {
            addr_ip(ai->ai_addr, out, len);
            rc = 0;
        }
    freeaddrinfo(res);
    return rc;
}

int ddp__sock_local_host(char *out, size_t len)
{
    const char *env = NULL, *ifname = NULL;
    int fam = FAM_ANY;
    DDP_TRY(ddp__env_string("DDP_TCP_HOST", &env));
    DDP_TRY(ddp__env_string("DDP_SOCKET_IFNAME", &ifname));
    DDP_TRY(ddp__env_word("DDP_SOCKET_FAMILY", &fam));
    if (env) { /* an explicit address wins over an interface name */
        snprintf(out, len, "%s", env);
        return 0;
    }
    if (ifname)
        return from_ifname(ifname, fam, out, len);
    if (fam != FAM_V6 && from_hostname(AF_INET, out, len) == 0)
        return 0;
    if (fam != FAM_V4 && from_hostname(AF_INET6, out, len) == 0)
        return 0;
    snprintf(out, len, "%s", fam == FAM_V6 ? "::1" : "127.0.0.1");
    return 0;
}
