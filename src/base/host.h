/* Who and where this process is: the host identity that decides who shares
 * memory (transport selection) and whose FileStore members are still alive
 * (store/file_store.c). */
#ifndef DDP_BASE_HOST_H
#define DDP_BASE_HOST_H

#include <stddef.h>

/* This host's identity: DDP_HOST_ID when set, else "<hostname>/<boot id>"
 * (no spaces).  Two containers with the same name on different machines
 * differ by boot id; a rebooted host gets a new one. */
int ddp__host_id(char *out, size_t len);

/* This process, as another one can check it later: "<host id> <pid
 * namespace> <pid> <start time>" (the start time tells a reused pid from
 * the original). */
int ddp__proc_id(char *out, size_t len);
/* Whether the process a ddp__proc_id names may still run: 0 when it is
 * certainly gone (its pid is free, or taken by a later process), 1 when
 * alive or when this process cannot tell (another host id or pid
 * namespace, an unreadable id). */
int ddp__proc_alive(const char *proc_id);

#endif
