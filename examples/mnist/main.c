/* ddp-mnist: the reference program.  PyTorch's beginner feed-forward example
 * in C against libddp, on one process or, started by ddprun (or mpirun,
 * srun), on N processes with DistributedDataParallel:
 *
 *   model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
 *   loss  = CrossEntropyLoss(); opt = SGD(model.parameters(), lr, momentum)
 *   data  = DataLoader(FashionMNIST(train=True, transform=ToTensor()),
 *                      batch_size=64, shuffle=True, num_workers)
 *   for epoch: for i, (images, labels) in enumerate(data): step;
 *       every 100 steps print "Epoch [e/N], Step [i/total], Loss: x.xxxx"
 *   then "Throughput: N samples/s" (training loop only, all ranks together)
 *   and "Test accuracy: NN.NN %" on the test split, from rank 0.
 * On a terminal a progress bar per epoch stands for the step lines;
 * --metrics FILE records the log steps and evaluations as JSON lines
 * (tools/ddp-plot draws them).
 *
 * Distributed: rank and world size come from the launcher's environment
 * (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, SLURM_*) or --rank and
 * --world-size; rendezvous through --init-method (env://, tcp://HOST:PORT,
 * file:///PATH).  Each rank trains on its DistributedSampler share; DDP
 * averages gradients during backward.  With --checkpoint-dir, rank 0 saves
 * model, optimizer and position every --checkpoint-every steps; --resume
 * (automatic after a ddprun restart) continues from there and ends with the
 * same weights as an uninterrupted run.
 *
 * Exit status: 0 on success, 2 for bad flags, a missing/malformed data set
 * or --load file, or an output rank 0 cannot write (one line on stderr, on
 * every rank), 1 for any other failure.  See --help. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mnist.h"

/* Rank and world size from the flags or the launcher; a process group when
 * there is more than one process or an init method was given. */
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
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    j->restart = restart ? atoi(restart) : 0;
    if (j->world == 1 && !a->init_method)
        return 0;
    return ddp_init_process_group(a->backend, a->init_method ? a->init_method : "env://",
                                  j->rank, j->world, a->timeout, &j->pg);
}

int main(int argc, char **argv)
{
    args a;
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc < 0 ? 0 : prc;
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines appear as they happen */
    /* The library is silent unless asked; a program shows its warnings
     * (a rendezvous still waiting for ranks, say) unless DDP_LOG_LEVEL says. */
    setenv("DDP_LOG_LEVEL", "warn", 0); /* 0: a level the user set stays */

    int status = 1, rc = 0;
    job j = {.a = &a};
    ddp_dataset_t *train_ds = NULL, *test_ds = NULL;
    ddp_loader_t *dl = NULL;
    ddp_sampler_t *sampler = NULL;
    if (ddp_env_bool("DDP_MNIST_PROFILE", &j.profile) < 0 ||
        ddp_env_bool("DDP_MNIST_TIMESTAMPS", &j.timestamps) < 0) {
        stop_error("%s", ddp_last_error());
        return 2;
    }

    if ((rc = join_job(&j)) < 0) {
        status = rc == DDP_ERR_INVALID_ARG ? 2 : 1;
        goto out;
    }
    /* Outputs before anything else: an unwritable --save, --checkpoint-dir
     * or --metrics stops the job now, not after training. */
    if ((prc = check_outputs(&j)) != 0) {
        status = prc; /* reported */
        goto out;
    }

    /* Data first, every input before the first step: a missing or broken
     * file of either split is a usage error (exit 2) found at once, not
     * after an epoch of training.  Every rank checks the test split, so that
     * all stop alike, and lets it go: rank 0 reads it again for the
     * evaluation once the training images (47 MB) are gone, so the peak
     * memory stays that of training (a re-read from the decompressed cache
     * takes a few ms). */
    double t0 = ddp_time_now();
    if (a.epochs > 0 && open_split(a.data, 1, &train_ds) < 0) {
        status = 2;
        goto out;
    }
    if (train_ds && j.rank == 0)
        printf("Loaded %zu training samples from %s in %.3f s\n",
               ddp_dataset_length(train_ds), a.data, ddp_time_now() - t0);
    if (open_split(a.data, 0, &test_ds) < 0) {
        status = 2;
        goto out;
    }
    if (j.rank != 0 || !a.eval_every) { /* kept by rank 0 to evaluate during training */
        ddp_dataset_destroy(test_ds);
        test_ds = NULL;
    }
    j.test = test_ds;

    if ((rc = build_model(&a, &j.model)) < 0 || (rc = ddp_tape_create(&j.tape)) < 0)
        goto out;
    /* With DDP, rank 0's parameters are broadcast: only it reads --load. */
    if (a.load && j.rank == 0 && (rc = ddp_model_load_safetensors(j.model, a.load)) < 0) {
        status = 2; /* a bad --load file is bad input, like a bad data set */
        goto out;
    }
    ddp_sgd_options so = ddp_sgd_defaults(a.lr);
    so.momentum = a.momentum;
    if ((rc = ddp_sgd_create(j.model, &so, &j.opt)) < 0)
        goto out;
    if ((prc = share_checkpoint(&j, load_checkpoint(&j))) != 0) {
        status = prc; /* reported */
        goto out;
    }
    if (a.pipeline_stages && !j.pg) {
        stop_error("--pipeline-stages needs a job of several ranks (ddprun)");
        status = 2;
        goto out;
    }
    if (a.pipeline_stages) { /* pipeline.c: stages and replicas instead of DDP */
        if ((rc = run_pipeline(&j, train_ds)) < 0 || (rc = ddp_pg_barrier(j.pg)) < 0)
            goto out;
        status = 0;
        goto out;
    }
    if (j.pg && a.zero != 2 && (rc = ddp_data_parallel_create(j.model, j.pg, NULL, &j.dm)) < 0)
        goto out; /* ZeRO-2 reduces the gradients itself (zero.c) */
    if ((rc = zero_setup(&j)) < 0)
        goto out;
    if (j.dm && a.powersgd) { /* PyTorch's powerSGD_hook on DDP's buckets */
        ddp_powersgd_options po = ddp_powersgd_defaults();
        po.matrix_approximation_rank = (int)a.powersgd;
        po.start_powersgd_iter = a.powersgd_start;
        if ((rc = ddp_data_parallel_register_powersgd(j.dm, &po, &j.psgd)) < 0)
            goto out;
        if ((prc = resume_powersgd(&j)) != 0) {
            status = prc; /* reported */
            goto out;
        }
    }

    if (train_ds) {
        ddp_loader_options lo = ddp_loader_defaults();
        lo.batch_size = (size_t)a.batch;
        lo.shuffle = a.shuffle;
        lo.seed = a.seed;
        lo.num_workers = (int)a.workers;
        /* A loader thread per rank competes with the ranks themselves when
         * every CPU already runs one: 3-10 % slower on 2 ranks x 2 CPUs
         * (7 of 7 alternated pairs); otherwise it has a core of its own. */
        if (a.workers < 0)
            lo.num_workers = j.local_world >= sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 1;
        if (j.pg) { /* each rank its share: torch's DistributedSampler */
            ddp_sampler_distributed_options dso = ddp_sampler_distributed_defaults();
            dso.num_replicas = j.world;
            dso.rank = j.rank;
            dso.shuffle = a.shuffle;
            dso.seed = a.seed;
            if ((rc = ddp_sampler_distributed_create(ddp_dataset_length(train_ds), &dso,
                                                     &sampler)) < 0)
                goto out;
            lo.sampler = sampler;
            lo.shuffle = 0; /* the sampler shuffles: both is an error, as in PyTorch */
        }
        if ((rc = ddp_loader_create(train_ds, &lo, &dl)) < 0 || (rc = train(&j, dl)) < 0)
            goto out;
        /* The training images (47 MB) go before the evaluation's loader
         * comes in. */
        ddp_loader_destroy(dl);
        dl = NULL;
        ddp_dataset_destroy(train_ds);
        train_ds = NULL;
    }
    if (j.rank == 0 && j.psgd) { /* what compression saved (PyTorch's compression stats) */
        double before, after;
        ddp_powersgd_stats(j.psgd, &before, &after);
        int64_t steps = ddp_powersgd_iter(j.psgd) - a.powersgd_start;
        printf("PowerSGD: %lld compressed steps, %.0f of %.0f gradient floats sent\n",
               (long long)(steps > 0 ? steps : 0), after, before);
    }
    if (j.rank == 0) {
        if (a.save && (rc = ddp_model_save_safetensors(j.model, a.save)) < 0)
            goto out;
        if (!test_ds && open_split(a.data, 0, &test_ds) < 0) {
            status = 2;
            goto out;
        }
        j.test = test_ds;
        if ((rc = report_eval(&j, (long)a.epochs, 1)) < 0)
            goto out;
    }
    /* The others wait for rank 0's evaluation before leaving the group. */
    if (j.pg && (rc = ddp_pg_barrier(j.pg)) < 0)
        goto out;
    status = 0;
out:
    if (rc < 0 && ddp_last_error()[0]) { /* else said already (stop_error) */
        if (j.pg)
            stop_error("rank %d: %s", j.rank, ddp_last_error());
        else
            stop_error("%s", ddp_last_error());
    }
    report_end(&j);
    ddp_loader_destroy(dl);
    ddp_sampler_destroy(sampler);
    ddp_data_parallel_destroy(j.dm);
    ddp_powersgd_destroy(j.psgd); /* after the model it hooks */
    zero_teardown(&j);
    ddp_tape_destroy(j.tape);
    ddp_model_destroy(j.model);
    ddp_dataset_destroy(test_ds);
    ddp_dataset_destroy(train_ds);
    ddp_destroy_process_group(j.pg);
    return status;
}
