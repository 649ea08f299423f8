#!/usr/bin/perl

# A yarl_zone too small for the quotas: the quotas that fit limit, the rest stay unlimited,
# an [alert] once per interval names the zone and how many are missing, yarl_stats shows
# it, and nothing crashes. nginx -t refuses sizes that hold nothing.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);
use Time::HiRes qw(sleep);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");

sub conf {
	my ($zone) = @_;
	$t->write_http_conf(<<"EOF2", workers => 2);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    $zone
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_check "q\$arg_q";
            add_header X-Yarl-Status \$yarl_status always;
        }
        location = /stats {
            yarl_stats;
        }
    }
EOF2
}

for my $bad (['100k', 'at least 256k'], ['lots', 'it must be a size'], ['0', 'at least 256k']) {
	conf("yarl_zone $bad->[0];");
	my ($rc, $out) = $t->test_config();
	isnt($rc, 0, "yarl_zone $bad->[0] refused");
	like($out, qr/\[emerg\].*invalid value "\Q$bad->[0]\E" in "yarl_zone" directive, .*\Q$bad->[1]\E/,
		"yarl_zone $bad->[0]: the [emerg] names the directive and the value");
}
conf("yarl_zone 256k; yarl_zone 1m;");
my ($rc, $out) = $t->test_config();
like($out, qr/"yarl_zone" directive is duplicate/, 'yarl_zone twice refused');

conf('yarl_zone 256k;');
$t->allow_alerts(qr/yarl: zone "yarl" is full: \d+ quotas are missing/);
$t->run_root('A');
$t->run();

my @batch = map { { name => "q$_", limit => 1, low_burst => 0, high_burst => 0, parent => undef } } 1 .. 3000;
my ($st, $body) = $t->admin('POST', '/v1/quotas:batch', \@batch);
is($st, 200, 'batch of 3000 quotas stored') or diag(explain($body));

my $s;
ok($t->wait_for(sub {
	$s = $t->stats($t->port(8080));
	$s && $s->{zone}{missing} > 0 && $s->{epoch} >= 3000;
}, 10), 'the zone reports missing quotas');
my $cap = $s->{zone}{capacity};
diag("256k holds $cap quotas; $s->{zone}{quotas} held, $s->{zone}{missing} missing");
cmp_ok($s->{zone}{quotas}, '<=', $cap, 'never more quotas than the capacity');
cmp_ok($s->{zone}{quotas}, '>', 100, 'the zone is used');
is($s->{zone}{quotas} + $s->{zone}{missing}, 3000, 'held + missing = every quota');

# The first quotas fit (they came first): limited. The last did not: unlimited.
my $r = http_get($t->port(8080), '/index.html?q=1');
like($r, qr/ 200 /, 'a held quota passes its first request');
my $r2 = http_get($t->port(8080), '/index.html?q=3000');
is(header_of($r2, 'X-Yarl-Status'), 'UNLIMITED', 'a missing quota is unlimited');
like($r2, qr/ 200 /, 'and passes');

ok($t->wait_for(sub { $t->read_file('error.log') =~ /\[alert\].*yarl: zone "yarl" is full: \d+ quotas are missing/ }, 5),
	'an [alert] names the zone and the missing quotas');
sleep 1;
my @alerts = $t->read_file('error.log') =~ /(zone "yarl" is full)/g;
cmp_ok(scalar @alerts, '<=', 1.5 / 0.2 + 2, 'at most one alert per interval (' . scalar(@alerts) . ')');

$t->finish();
done_testing();
