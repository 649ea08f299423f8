#!/usr/bin/perl

# Shadow mode per quota ("dry_run": true through the admin API): every nginx decides and
# counts what the quota would reject ($yarl_status REJECTED_DRY_RUN, yarl_stats,
# yarl_metrics, the error log) but lets the request through, while an enforced parent still
# limits it; flipping the flag with a PUT enforces the quota within the usual quota-change
# time, and flipping it back stops enforcing. A template in shadow mode puts its keys in it.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of body_of);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_zone 8m keys=1000;
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    yarl_log_level warn;
    log_format yarl '$status $yarl_status $yarl_quota';
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        add_header X-Yarl-Status $yarl_status always;
        add_header X-Yarl-Quota $yarl_quota always;
        access_log %%TESTDIR%%/yarl.log yarl;
        location /new/ { alias %%TESTDIR%%/; yarl_account new_limit; }
        location /key/ { alias %%TESTDIR%%/; yarl_account "k_$arg_k"; }
        location = /stats { yarl_stats; }
        location = /metrics { yarl_metrics; }
    }
EOF2
$t->run_root('A');
$t->run();
my $p = $t->port(8080);
# A new limit of 3 (hard cutoff, draining 1 in 100 s) tried in shadow mode under an enforced
# parent of 6.
my ($st) = $t->admin('POST', '/v1/quotas:batch', [
	{ name => 'all', limit => 0.01, low_burst => 6, high_burst => 6 },
	{ name => 'new_limit', limit => 0.01, low_burst => 3, high_burst => 3, parent => 'all', dry_run => JSON::PP::true },
	{ name => 'k_*', limit => 0.01, low_burst => 1, high_burst => 1, dry_run => JSON::PP::true },
]);
is($st, 200, 'quotas created, two in shadow mode');
ok($t->wait_quota($p, 'new_limit', 5), 'nginx holds them');
my $q = $t->stats($p, '/stats?quota=new_limit')->{quota};
ok($q->{dry_run}, 'yarl_stats shows the shadow mode');

# Hard cutoffs: a quota passes while its fill is at most its burst, so the shadow quota
# would let 4 in, the parent lets 7 in.
my @r = map { http_get($p, '/new/index.html') } 1 .. 8;
is_deeply([map { status_of($_) } @r], [(200) x 7, 429], 'the enforced parent rejects the 8th');
is_deeply([map { header_of($_, 'X-Yarl-Status') } @r],
	[('PASSED') x 4, ('REJECTED_DRY_RUN') x 3, 'REJECTED'],
	'$yarl_status: REJECTED_DRY_RUN where the shadow quota would reject');
is_deeply([map { header_of($_, 'X-Yarl-Quota') } @r[4 .. 7]], [qw(new_limit new_limit new_limit all)],
	'$yarl_quota names the quota that would reject, then the one that did');
cmp_ok(abs($t->stats($p, '/stats?quota=new_limit')->{quota}{fill} - 4), '<', 0.01,
	'the shadow quota holds what enforcing it would have let in (4)');
cmp_ok(abs($t->stats($p, '/stats?quota=all')->{quota}{fill} - 7), '<', 0.01,
	'the enforced parent counted every request it let through (7)');
my $s = $t->stats($p);
is($s->{requests}{rejected_dry_run}, 3, 'yarl_stats counts 3 requests passed in shadow mode');
my $m = body_of(http_get($p, '/metrics'));
like($m, qr/^yarl_requests_total\{status="rejected_dry_run"\} 3$/m, 'yarl_metrics too');
# The 8th would have been rejected by the shadow quota too: 4 of its rejections.
like($m, qr/^yarl_quota_rejections_total\{quota="new_limit"\} 4$/m, 'by quota');

# A template in shadow mode: its keys are.
my @k = map { header_of(http_get($p, '/key/index.html?k=a'), 'X-Yarl-Status') } 1 .. 3;
is_deeply(\@k, [qw(PASSED PASSED REJECTED_DRY_RUN)], 'a key of a shadow template is in shadow mode');

# Enforce it: a PUT without dry_run.
$t->put_quota('new_limit', 0.01, 3, 3, 'all');
ok($t->wait_for(sub { !$t->stats($p, '/stats?quota=new_limit')->{quota}{dry_run} }, 5),
	'enforced within the quota-change time');
my $r = http_get($p, '/new/index.html');
is(status_of($r), 429, 'the quota now rejects');
is(header_of($r, 'X-Yarl-Quota'), 'new_limit', 'itself');
# And back to shadow mode.
my ($st2) = $t->admin('PUT', '/v1/quotas/new_limit',
	{ limit => 0.01, low_burst => 3, high_burst => 3, parent => 'all', dry_run => JSON::PP::true });
is($st2, 200, 'back to shadow mode');
ok($t->wait_for(sub { $t->stats($p, '/stats?quota=new_limit')->{quota}{dry_run} }, 5), 'seen by nginx');

$t->finish();
my $log = $t->read_file('error.log');
like($log, qr/\[warn\] .*limiting requests by quota "new_limit", fill 4\.000, dry run \(the quota is in shadow mode\)/,
	'shadow rejections are logged, saying so');
my $access = $t->read_file('yarl.log');
like($access, qr/^200 REJECTED_DRY_RUN new_limit$/m, 'and in the access log');
done_testing();
