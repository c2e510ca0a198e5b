/* Calls getpid (see next_interposer.c) and says whether it got a pid. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("pid_ok=%d\n", getpid() > 0);
    return 0;
}
