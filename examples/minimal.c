/* The front door: PyTorch's minimal DDP program (an MLP on MNIST-format
 * data) as a user writes it against libddp.  Run it with a launcher:
 *   ddprun --standalone --nproc-per-node 2 build/bin/ddp-minimal [DATA_DIR [EPOCHS]]
 * DATA_DIR holds train-{images-idx3,labels-idx1}-ubyte[.gz] (default
 * /usr/share/datasets/fashion-mnist). */
#include <ddp.h>

int main(int argc, char **argv)
{
    int epochs = argc > 2 ? atoi(argv[2]) : 1, rc;
    ddp_pg_t *pg; ddp_module_t *layers[3], *seq; ddp_model_t *model; ddp_data_parallel_t *dm;
    ddp_optim_t *opt; ddp_dataset_t *ds; ddp_loader_t *dl; ddp_tape_t *tape; ddp_var_t *x, *y, *loss;
    DDP_CHECK(ddp_init_process_group_env("tcp", 0, &pg));
    DDP_CHECK(ddp_linear_create(784, 256, 1, 1, &layers[0]));
    DDP_CHECK(ddp_relu_create(&layers[1]));
    DDP_CHECK(ddp_linear_create(256, 10, 1, 2, &layers[2]));
    DDP_CHECK(ddp_sequential_create(layers, 3, &seq));
    DDP_CHECK(ddp_model_from_module(seq, &model));
    DDP_CHECK(ddp_data_parallel_create(model, pg, NULL, &dm));
    DDP_CHECK(ddp_sgd_create(model, &(ddp_sgd_options){.lr = 0.1}, &opt));
    DDP_CHECK(ddp_mnist_create(argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist", NULL, &ds));
    ddp_loader_options lo = ddp_loader_defaults();
    lo.batch_size = 64;
    lo.shuffle = 1;
    DDP_CHECK(ddp_loader_distributed_create(ds, pg, &lo, &dl));
    DDP_CHECK(ddp_tape_create(&tape));
    for (int epoch = 0; epoch < epochs; epoch++) {
        DDP_CHECK(ddp_loader_epoch_begin(dl, (uint64_t)epoch));
        for (ddp_batch b; (rc = ddp_loader_next(dl, &b)) == 1;) {
            ddp_tape_reset(tape);
            DDP_CHECK(ddp_batch_input(&b, tape, &x));
            DDP_CHECK(ddp_data_parallel_forward(dm, tape, x, &y));
            DDP_CHECK(ddp_op_cross_entropy(tape, y, b.y64, &loss));
            ddp_optim_zero_grad(opt);
            DDP_CHECK(ddp_data_parallel_backward(dm, tape, loss));
            DDP_CHECK(ddp_optim_step(opt));
            if ((b.index + 1) % 100 == 0 && ddp_pg_rank(pg) == 0)
                printf("Epoch [%d/%d], Step [%zu/%zu], Loss: %.4f\n", epoch + 1, epochs,
                       b.index + 1, ddp_loader_length(dl), ddp_var_item(loss));
        }
        DDP_CHECK(rc);
    }
    ddp_tape_destroy(tape);
    ddp_loader_destroy(dl);
    ddp_dataset_destroy(ds);
    ddp_optim_destroy(opt);
    ddp_data_parallel_destroy(dm);
    ddp_model_destroy(model);
    ddp_destroy_process_group(pg);
    return 0;
}
