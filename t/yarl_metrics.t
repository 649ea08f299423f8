#!/usr/bin/perl

# yarl_metrics: the host's limiter in the Prometheus text format, checked with the
# prometheus_client parser (t/lib/check_metrics.py): requests by $yarl_status, rejections of
# the top quotas with the rest under one label, sync requests and latency per root, zone
# use, freshness and the agent. Cardinality stays bounded with many rejecting quotas.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of body_of header_of);
use IPC::Open2;

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_roots %%ROOT_A%% http://127.0.0.1:%%PORT_8099%%;
    yarl_sync_interval 100ms;
    yarl_sync_timeout 50ms;
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        location / {
            yarl_check "q$arg_q";
        }
        location /dry {
            yarl_check "q$arg_q";
            yarl_dry_run on;
            alias %%TESTDIR%%/index.html;
        }
        location /fill {
            yarl_account "q$arg_q";
            alias %%TESTDIR%%/index.html;
        }
        location = /metrics { yarl_metrics; }
    }
EOF2
$t->run_root('A');
$t->run();

sub check_page {
	my ($page) = @_;
	my $pid = open2(my $out, my $in, '/usr/bin/python3', "$FindBin::Bin/lib/check_metrics.py");
	print $in $page;
	close $in;
	local $/;
	my $verdict = <$out> // '';
	waitpid($pid, 0);
	return ($? >> 8, $verdict);
}

# 60 quotas that reject at once (hard cutoff at 0 after one request), 2 that pass.
my @batch = map { { name => "q$_", limit => 0.001, low_burst => 0, high_burst => 0, parent => undef } } 1 .. 60;
push @batch, map { { name => "ok$_", limit => 1000, low_burst => 1000, high_burst => 1000, parent => undef } } 1 .. 2;
my ($st) = $t->admin('POST', '/v1/quotas:batch', \@batch);
is($st, 200, 'quotas created');
ok($t->wait_for(sub { body_of(http_get($t->port(8080), '/metrics')) =~ /^yarl_quotas 62$/m }, 5), 'quotas fetched');

# One unit in each q (low = high = 0): from then on every check of it rejects.
is(status_of(http_get($t->port(8080), "/fill?q=$_")), 200, "q$_ filled") for 1 .. 60;
# q1..q30 reject several times each, q31..q60 once, so the first 30 rank highest.
for my $i (1 .. 60) {
	my $n = $i <= 30 ? 3 : 1;
	is(status_of(http_get($t->port(8080), "/index.html?q=$i")), 429, "q$i rejects") for 1 .. $n;
}
http_get($t->port(8080), '/dry?q=1');
http_get($t->port(8080), '/index.html?q=none');
http_get($t->port(8080), '/index.html?q=') ;

ok($t->wait_for(sub { body_of(http_get($t->port(8080), '/metrics')) =~ /yarl_sync_requests_total\{root="http:\/\/127.0.0.1:\d+",result="failed"\} [1-9]/ }, 5),
	'the unreachable root shows failed syncs');
my $r = http_get($t->port(8080), '/metrics');
like($r, qr/ 200 /, 'metrics answer 200');
like(header_of($r, 'Content-Type'), qr{^text/plain; version=0\.0\.4}, 'the text exposition format');
my $page = body_of($r);
my ($rc, $verdict) = check_page($page);
is($rc, 0, "the Prometheus parser accepts the page: $verdict");
diag($verdict);

like($page, qr/^yarl_requests_total\{status="rejected"\} (\d+)$/m, 'rejections by $yarl_status');
like($page, qr/^yarl_requests_total\{status="rejected_dry_run"\} 1$/m, 'dry-run rejections');
like($page, qr/^yarl_requests_total\{status="unlimited"\} [1-9]/m, 'unlimited requests');
my @named = $page =~ /^yarl_quota_rejections_total\{quota="(q\d+)"\} \d+$/mg;
is(scalar @named, 20, 'twenty quotas by name');
ok(!grep({ /^q(\d+)$/ && $1 > 30 } @named), 'the ones that rejected most');
# No "rest" series: which quotas are named changes, and a counter of the rest went down
# when one joined them. The total is its own counter.
unlike($page, qr/^yarl_quota_rejections_total\{quota="_other"\}/m, 'no rest of a counter');
my ($total) = $page =~ /^yarl_rejections_total (\d+)$/m;
my $sum = 0;
$sum += $_ for $page =~ /^yarl_quota_rejections_total\{quota="q\d+"\} (\d+)$/mg;
cmp_ok($sum, '<', $total, 'the named are part of every rejection');
like($page, qr/^yarl_sync_duration_seconds_count\{root="http:\/\/127\.0\.0\.1:\d+"\} [1-9]/m, 'a latency histogram per root');
like($page, qr/^yarl_sync_root_up\{root="http:\/\/127\.0\.0\.1:\d+"\} 0$/m, 'the dead root is down');
like($page, qr/^yarl_zone_size_bytes \d+$/m, 'zone size');
like($page, qr/^yarl_cluster_fresh 1$/m, 'the cluster view is fresh');
like($page, qr/^yarl_sync_agent_up 1$/m, 'the agent runs');
my $lines = () = $page =~ /\n/g;
diag("$lines lines for 62 quotas, 60 rejecting, 2 roots");
cmp_ok($lines, '<', 165, 'bounded');

$t->finish();
done_testing();
