/* Test-set evaluation: whole set, or one rank's shard for a distributed
 * evaluation whose sums are all-reduced by the caller. */
#include "core/autograd.h"
#include "train/train_loop.h"

/* Keeps the first `keep` rows of *t (a batch that runs into the sampler's
 * padding). */
static dt_status keep_rows(dt_tensor **t, int64_t keep) {
  dt_tensor *s = NULL;
  DT_CHECK(dt_tensor_slice(*t, 0, keep, &s));
  dt_tensor_release(*t);
  *t = s;
  return DT_OK;
}

dt_status dt_train_evaluate_shard(const dt_task *task, dt_module *model, const dt_dataset *data,
                                  int batch, dt_device dev, int rank, int world, double *loss_sum,
                                  double *metric_sum, int64_t *count) {
  return dt_train_evaluate_first(task, model, data, 0, batch, 1, dev, rank, world, loss_sum,
                                 metric_sum, count);
}

dt_status dt_train_evaluate_first(const dt_task *task, dt_module *model, const dt_dataset *data,
                                  int64_t first, int batch, int workers, dt_device dev, int rank,
                                  int world, double *loss_sum, double *metric_sum, int64_t *count) {
  dt_status st = DT_OK;
  dt_sampler *sampler = NULL;
  dt_loader *loader = NULL;
  dt_tensor *x = NULL, *y = NULL, *output = NULL, *batch_loss = NULL;
  int was_training = dt_module_is_training(model);
  int64_t len = dt_dataset_length(data);
  /* The sampler is not shuffled: the samples below `first` are the
   * positions below it. */
  int64_t used = first > 0 && first < len ? first : len;
  /* DistributedSampler pads the tail by repeating the start; the padded
   * positions come last in a rank's list, so its real samples are the
   * first `real` ones: positions rank, rank + world, ... below len. */
  int64_t real = rank < used ? (used - rank + world - 1) / world : 0;
  *loss_sum = 0.0;
  *metric_sum = 0.0;
  *count = 0;

  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.shuffle = 0;
  sc.num_replicas = world;
  sc.rank = rank;
  sc.drop_last = 0;
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  /* A batch larger than the shard would only allocate padding. */
  lc.batch_size = real > 0 && batch > real ? (int)real : batch;
  lc.device = dev;
  lc.workers = workers;
  DT_CHECK(dt_sampler_create(len, &sc, &sampler));
  st = dt_loader_create(data, sampler, &lc, &loader);
  if (st != DT_OK) {
    st = dt_error_wrap(st, "the evaluation's batches (`eval_batch` %d)", lc.batch_size);
    goto free_sampler;
  }
  DT_CHECK_GOTO(dt_loader_start_epoch(loader, 0), st, free_loader);

  dt_module_train(model, 0);
  dt_no_grad_begin();
  while (*count < real) {
    DT_CHECK_GOTO(dt_loader_next(loader, &x, &y), st, free_batch);
    if (x == NULL)
      break;
    int64_t b = dt_tensor_dim(y, 0);
    if (*count + b > real) {
      DT_CHECK_GOTO(keep_rows(&x, real - *count), st, free_batch);
      DT_CHECK_GOTO(keep_rows(&y, real - *count), st, free_batch);
      b = real - *count;
    }
    DT_CHECK_GOTO(dt_module_call(model, x, &output), st, free_batch);
    DT_CHECK_GOTO(task->loss(output, y, DT_REDUCTION_SUM, &batch_loss), st, free_batch);
    double v;
    DT_CHECK_GOTO(dt_tensor_item(batch_loss, 0, &v), st, free_batch);
    *loss_sum += v;
    if (task->metric)
      DT_CHECK_GOTO(task->metric(output, y, metric_sum), st, free_batch);
    *count += b;
    dt_tensor_release(batch_loss);
    dt_tensor_release(output);
    dt_tensor_release(x);
    dt_tensor_release(y);
    x = y = output = batch_loss = NULL;
  }
free_batch:
  dt_tensor_release(batch_loss);
  dt_tensor_release(output);
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_no_grad_end();
  dt_module_train(model, was_training);
free_loader:
  dt_loader_destroy(loader);
free_sampler:
  dt_sampler_destroy(sampler);
  return st;
}

dt_status dt_train_evaluate(const dt_task *task, dt_module *model, const dt_dataset *data,
                            int batch, dt_device dev, double *loss, double *metric) {
  double loss_sum = 0.0, metric_sum = 0.0;
  int64_t seen = 0;
  DT_CHECK(
      dt_train_evaluate_shard(task, model, data, batch, dev, 0, 1, &loss_sum, &metric_sum, &seen));
  *loss = seen ? loss_sum / (double)seen : 0.0;
  *metric = seen ? metric_sum / (double)seen : 0.0;
  return DT_OK;
}
