/*
 * Stand-in for registry.k8s.io/e2e-test-images/nonewprivs: installed setuid
 * root, it prints its effective uid. critest runs it as uid 1000 and expects
 * "Effective uid: 0" without no_new_privs and "Effective uid: 1000" with it.
 */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
	printf("Effective uid: %d\n", (int)geteuid());
	return 0;
}
