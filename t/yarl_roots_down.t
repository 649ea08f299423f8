#!/usr/bin/perl

# All roots down (one refusing connections, one accepting and never answering): requests
# pass, and the request latency is the same as in a location without the module.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

my $t = Test::Yarl->new();

# A black hole: the kernel completes the handshake (listen backlog), nobody ever answers.
my $hole = IO::Socket::INET->new(Listen => 64, LocalAddr => '127.0.0.1', LocalPort => 0,
	Proto => 'tcp', ReuseAddr => 1) or die "listen: $!\n";
my $hole_port = $hole->sockport;
my $refused = $t->port('REFUSED');

$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<"EOF2", workers => 1);
    yarl_roots http://127.0.0.1:$refused http://127.0.0.1:$hole_port;
    yarl_sync_interval 100ms;
    yarl_sync_timeout 300ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        add_header X-Yarl-Status \$yarl_status always;
        location /limited/ { alias %%TESTDIR%%/; yarl_account "app_\$arg_a"; yarl_check global; }
        location /plain/ { alias %%TESTDIR%%/; }
        location = /stats { yarl_stats; }
    }
EOF2
$t->run();
my $p = $t->port(8080);

# Let a few sync rounds fail (and the black hole's calls time out) first.
sleep 1;

sub median {
	my @s = sort { $a <=> $b } @_;
	return $s[@s / 2];
}

my (@lim, @plain, @st);
for my $i (1 .. 300) {
	my $t0 = time();
	my $r = http_get($p, "/limited/index.html?a=$i");
	push @lim, time() - $t0;
	push @st, status_of($r);
	$t0 = time();
	http_get($p, '/plain/index.html');
	push @plain, time() - $t0;
}
is(scalar(grep { $_ != 200 } @st), 0, 'all requests pass with every root down');
my ($ml, $mp) = (median(@lim), median(@plain));
my $p99 = (sort { $a <=> $b } @lim)[int(0.99 * @lim)];
diag(sprintf 'median %.3f ms with the module, %.3f ms without; p99 %.3f ms',
	$ml * 1000, $mp * 1000, $p99 * 1000);
ok($ml < $mp * 1.5 + 0.001, 'median latency unchanged');
# A request that waited for a sync call would take its 300 ms timeout; 150 ms leaves room
# for a loaded machine's stalls.
ok($p99 < 0.15, 'no request waits for a sync call (p99 under 150 ms, sync timeout is 300 ms)');
is(header_of(http_get($p, '/limited/index.html?a=x'), 'X-Yarl-Status'), 'UNLIMITED',
	'$yarl_status UNLIMITED without quotas');

my $s = $t->stats($p);
is(scalar @{$s->{roots}}, 2, 'stats list both roots');
ok(!grep({ $_->{ok} } @{$s->{roots}}), 'both roots failing');
ok(!grep({ !$_->{last_error} } @{$s->{roots}}), 'each root has its last error: '
	. join('; ', map { $_->{last_error} // '' } @{$s->{roots}}));
is($s->{cluster_fresh}, JSON::PP::false, 'cluster not fresh');

$t->finish();
close $hole;
done_testing();
