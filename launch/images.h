/* `dtrain images`: an idx data set (Fashion-MNIST, MNIST) written out as an
 * image folder of PNG or JPEG files (core/image.h reads it back). */
#ifndef DT_LAUNCH_IMAGES_H
#define DT_LAUNCH_IMAGES_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "images". Returns the exit status: 0
 * (after --help too), 1 on a failure, 2 on a bad command line; messages go
 * to `err`. */
int dt_cli_images(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
