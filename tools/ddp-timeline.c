/* ddp-timeline: merges the timeline files of a job's ranks (written with
 * DDP_TIMELINE_DIR, docs/timeline.md) into one Chrome trace, one process
 * per rank, for ui.perfetto.dev or chrome://tracing.  ddprun does this by
 * itself for the ranks it started; this command is for the files of
 * several nodes gathered into one folder, or any list of them.
 *
 *   ddp-timeline merge DIR                 DIR/timeline-rank*.json -> DIR/timeline.json
 *   ddp-timeline merge -o OUT FILE...      the files, in that order -> OUT
 */
#include <stdio.h>
#include <string.h>

#include "base/timeline.h"

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: ddp-timeline merge DIR\n"
               "       ddp-timeline merge -o OUT FILE...\n"
               "Merges the ranks' timelines (DDP_TIMELINE_DIR) into one Chrome trace.\n");
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return usage(stdout, 0);
    if (argc < 3 || strcmp(argv[1], "merge") != 0)
        return usage(stderr, 2);
    int rc, n = 0;
    const char *out = NULL;
    if (!strcmp(argv[2], "-o")) {
        if (argc < 5)
            return usage(stderr, 2);
        out = argv[3];
        n = argc - 4;
        rc = ddp__timeline_merge((const char *const *)argv + 4, n, out);
    } else {
        if (argc != 3)
            return usage(stderr, 2);
        rc = ddp__timeline_merge_dir(argv[2], NULL, &n);
    }
    if (rc < 0) {
        fprintf(stderr, "ddp-timeline: %s\n", ddp_last_error());
        return 1;
    }
    if (out)
        printf("%d files merged into %s\n", n, out);
    else
        printf("%d ranks merged into %s/timeline.json\n", n, argv[2]);
    return 0;
}
