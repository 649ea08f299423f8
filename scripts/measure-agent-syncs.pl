#!/usr/bin/perl

# Usage: TEST_NGINX_BINARY=… TEST_YARL_MODULE=… TEST_YARL_ROOT=… \
#        perl scripts/measure-agent-syncs.pl [WORKERS…]   (default: 1 4)
#
# Sync requests a root receives from one nginx per interval, for each worker count: one
# nginx at a time (yarl_sync_interval 200ms, yarl_sync_early off, steady traffic on a
# quota), 25 intervals counted on the root's yarl_root_sync_requests_total after a warm-up.
# With one sync agent per nginx the figure is 1 whatever worker_processes is.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/../t/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use Time::HiRes qw(time sleep);

my @workers = @ARGV ? @ARGV : (1, 4);
my $INTERVAL = 0.2;
my $COUNT = 25;

for my $w (@workers) {
	my $t = Test::Yarl->new();
	$t->write_file('index.html', "hello\n");
	$t->write_file_expand('nginx.conf', <<"EOF2");
%%TEST_GLOBALS%%
worker_processes $w;
events { }
http {
    %%TEST_GLOBALS_HTTP%%
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    yarl_sync_early off;
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        location / { yarl_account q; }
        location = /stats { yarl_stats; }
    }
}
EOF2
	$t->run_root('A');
	$t->run();
	$t->put_quota('q', 1000, 2000, 4000);
	$t->wait_quota($t->port(8080), 'q', 5) or die "nginx did not fetch the quota\n";
	my $syncs = sub { $t->root_metrics()->{'yarl_root_sync_requests_total{result="ok"}'} // 0 };
	my $limiters = sub { $t->root_metrics()->{'yarl_root_limiters'} // 0 };
	sleep 1;
	my ($s0, $t0) = ($syncs->(), time());
	# Traffic throughout (a request every 10 ms, new connections, so every worker counts).
	while (time() - $t0 < $COUNT * $INTERVAL) {
		http_get($t->port(8080), '/index.html');
		sleep 0.01;
	}
	my ($s1, $t1) = ($syncs->(), time());
	my $per = ($s1 - $s0) / (($t1 - $t0) / $INTERVAL);
	printf("worker_processes %d: %d sync requests in %.2f s = %.2f per interval; limiters at the root: %d\n",
		$w, $s1 - $s0, $t1 - $t0, $per, $limiters->());
	$t->finish();
}
done_testing();
