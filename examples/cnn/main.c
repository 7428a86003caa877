/* ddp-cnn: PyTorch's examples/mnist (the convolutional network) in C
 * against libddp, on one process or, started by ddprun (or mpirun, srun),
 * on N processes with DistributedDataParallel:
 *
 *   model = Net()   # conv 1->32 3x3, conv 32->64 3x3, max pool, dropout, 2 linears
 *   opt   = Adadelta(model.parameters(), lr=1.0); sched = StepLR(opt, 1, gamma=0.7)
 *   data  = DataLoader(FashionMNIST(train=True), batch_size=64, shuffle=True)
 *   for epoch: for i, (x, y) in enumerate(data):
 *       loss = F.nll_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
 *       every 100 steps print "Epoch [e/N], Step [i/total], Loss: x.xxxx"
 *     sched.step()
 *   then "Throughput: N samples/s" (training loop, all ranks together) and
 *   "Test accuracy: NN.NN %" on the test split, from rank 0.
 *
 * Distributed as ddp-mnist: rank and world size from the launcher's
 * environment or --rank/--world-size, rendezvous through --init-method,
 * each rank its DistributedSampler share, DDP averaging gradients during
 * backward.  Exit status: 0 ok, 2 bad flags, data set or --load file, 1 any
 * other failure.  See --help. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cnn.h"

void stop_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddp-cnn: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static int join_job(job *j)
{
    const args *a = j->a;
    ddp_launch_info li;
    int rc = ddp_launch_info_from_env(&li);
    if (rc == DDP_ERR_INVALID_ARG)
        return rc;
    j->rank = 0;
    j->world = 1;
    j->local_world = rc == 0 ? li.local_world_size : 1;
    if (a->rank >= 0) {
        j->rank = (int)a->rank;
        j->world = (int)a->world_size;
    } else if (rc == 0) {
        j->rank = li.rank;
        j->world = li.world_size;
    }
    if (j->world == 1 && !a->init_method)
        return 0;
    return ddp_init_process_group(a->backend, a->init_method ? a->init_method : "env://",
                                  j->rank, j->world, a->timeout, &j->pg);
}

/* Model, tape, Adadelta, StepLR, --load, checkpoint, DDP. Returns 0, a
 * negative code (message in ddp_last_error), or an exit status already
 * reported (> 0). */
static int set_up(job *j)
{
    const args *a = j->a;
    int rc;
    if ((rc = build_model(a, j->rank, &j->model)) < 0 || (rc = ddp_tape_create(&j->tape)) < 0)
        return rc;
    if (a->load && j->rank == 0 && ddp_model_load_safetensors(j->model, a->load) < 0) {
        stop_error("%s", ddp_last_error());
        return 2;
    }
    ddp_adadelta_options ao = ddp_adadelta_defaults();
    ao.lr = a->lr;
    ddp_lr_options lo = {.kind = DDP_LR_STEP, .step_size = 1, .gamma = a->gamma};
    if ((rc = ddp_adadelta_create(j->model, &ao, &j->opt)) < 0 ||
        (rc = ddp_lr_scheduler_create(j->opt, &lo, &j->sched)) < 0)
        return rc;
    if (a->ckpt_dir)
        snprintf(j->ckpt, sizeof j->ckpt, "%s/checkpoint.safetensors", a->ckpt_dir);
    if ((rc = resume(j)) != 0)
        return rc;
    if (j->pg && (rc = ddp_data_parallel_create(j->model, j->pg, NULL, &j->dm)) < 0)
        return rc;
    return 0;
}

static int make_loader(job *j, ddp_dataset_t *ds, ddp_sampler_t **sampler, ddp_loader_t **dl)
{
    const args *a = j->a;
    ddp_loader_options lo = ddp_loader_defaults();
    lo.batch_size = (size_t)a->batch;
    lo.shuffle = a->shuffle;
    lo.seed = a->seed;
    lo.num_workers = (int)a->workers;
    if (a->workers < 0) /* a loader thread competes with ranks that fill every CPU */
        lo.num_workers = j->local_world >= sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 1;
    if (j->pg) { /* each rank its share: torch's DistributedSampler */
        ddp_sampler_distributed_options dso = ddp_sampler_distributed_defaults();
        dso.num_replicas = j->world;
        dso.rank = j->rank;
        dso.shuffle = a->shuffle;
        dso.seed = a->seed;
        int rc = ddp_sampler_distributed_create(ddp_dataset_length(ds), &dso, sampler);
        if (rc < 0)
            return rc;
        lo.sampler = *sampler;
        lo.shuffle = 0;
    }
    return ddp_loader_create(ds, &lo, dl);
}

int main(int argc, char **argv)
{
    args a;
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc < 0 ? 0 : prc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("DDP_LOG_LEVEL", "warn", 0);
    int status = 1, rc = 0;
    job j = {.a = &a};
    ddp_dataset_t *train_ds = NULL, *test_ds = NULL;
    ddp_loader_t *dl = NULL;
    ddp_sampler_t *sampler = NULL;
    if ((rc = join_job(&j)) < 0) {
        status = rc == DDP_ERR_INVALID_ARG ? 2 : 1;
        goto out;
    }
    /* Both splits before the first step: a broken file stops the job now. */
    if ((a.epochs > 0 && open_split(a.data, 1, &train_ds) < 0) ||
        open_split(a.data, 0, &test_ds) < 0) {
        status = 2;
        rc = 0;
        goto out;
    }
    if ((prc = set_up(&j)) != 0) {
        if (prc > 0)
            status = prc;
        rc = prc < 0 ? prc : 0;
        goto out;
    }
    if (train_ds && ((rc = make_loader(&j, train_ds, &sampler, &dl)) < 0 ||
                     (rc = train(&j, dl)) < 0))
        goto out;
    if (j.rank == 0) {
        double loss, acc;
        if ((a.save && (rc = ddp_model_save_safetensors(j.model, a.save)) < 0) ||
            (rc = evaluate(&j, test_ds, &loss, &acc)) < 0)
            goto out;
        printf("Test loss: %.4f\nTest accuracy: %.2f %%\n", loss, acc);
    }
    if (j.pg && (rc = ddp_pg_barrier(j.pg)) < 0) /* others wait for rank 0's evaluation */
        goto out;
    status = 0;
out:
    if (rc < 0)
        stop_error("rank %d: %s", j.rank, ddp_last_error());
    ddp_loader_destroy(dl);
    ddp_sampler_destroy(sampler);
    ddp_data_parallel_destroy(j.dm);
    ddp_lr_scheduler_destroy(j.sched);
    ddp_optim_destroy(j.opt);
    ddp_tape_destroy(j.tape);
    ddp_model_destroy(j.model);
    ddp_dataset_destroy(test_ds);
    ddp_dataset_destroy(train_ds);
    ddp_destroy_process_group(j.pg);
    return status;
}
