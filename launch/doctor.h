/* `dtrain doctor`: what this build can use on this machine (devices, CPU
 * threads, memory cap, data sets), so a failing run can be diagnosed. */
#ifndef DT_LAUNCH_DOCTOR_H
#define DT_LAUNCH_DOCTOR_H

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "doctor". Returns the exit status. */
int dt_cli_doctor(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
