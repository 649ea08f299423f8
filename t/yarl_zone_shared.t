#!/usr/bin/perl

# One limiter per nginx: two workers decide on the same counters in the yarl_zone. With the
# quota fetched and the root stopped (nothing but the zone counts), a quota of 10/s hit at
# 40/s across both workers admits about 10/s, not 10/s per worker.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use Time::HiRes qw(time sleep);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    log_format worker '$pid $status';
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        access_log %%TESTDIR%%/worker.log worker;
        location / {
            yarl_account q;
        }
        location = /stats {
            access_log off;
            yarl_stats;
        }
    }
EOF2
$t->run_root('A');
$t->run();
$t->put_quota('q', 10, 5, 5);
ok($t->wait_quota($t->port(8080), 'q', 5), 'the zone holds the quota');

# Both workers render the same host state.
my %ids;
for (1 .. 20) {
	my $s = $t->stats($t->port(8080)) or next;
	$ids{$s->{pid}} = $s->{limiter_id};
}
is(scalar keys %ids, 2, 'both workers answered the stats page');
my %unique = map { $_ => 1 } values %ids;
is(scalar keys %unique, 1, 'one limiter id for both workers');

$t->stop_root('A');
sleep 1.2;

# 40 requests per second for 4 s, a new connection each (reuseport spreads them).
my ($admitted, $sent) = (0, 0);
my $start = time();
while ($sent < 160) {
	my $due = $start + $sent * 0.025;
	my $wait = $due - time();
	sleep $wait if $wait > 0;
	$sent++;
	$admitted++ if status_of(http_get($t->port(8080), '/index.html')) == 200;
}
my $secs = time() - $start;
# A zone shared by both workers admits the burst (5) and 10/s: about 45 in 4 s; a limiter
# per worker would admit about twice that.
diag(sprintf('admitted %d of %d in %.1f s (%.1f/s)', $admitted, $sent, $secs, $admitted / $secs));
cmp_ok($admitted, '>=', 30, 'the quota admits its rate');
cmp_ok($admitted, '<=', 5 + 10 * $secs + 8, 'one count for both workers, not one each');

my %pids;
for (split /\n/, $t->read_file('worker.log')) {
	$pids{$1}++ if /^(\d+) \d+$/;
}
is(scalar keys %pids, 2, 'both workers served the requests: ' . join(', ', map { "$_: $pids{$_}" } sort keys %pids));

my $s = $t->stats($t->port(8080));
is($s->{requests}{checked}, $sent, 'request counters are host-wide');
is($s->{requests}{passed}, $admitted, 'passed, host-wide');
ok($s->{agent}{pid} && grep({ $_ == $s->{agent}{pid} } $t->worker_pids), 'a worker holds the agent role');

$t->finish();
done_testing();
