#!/usr/bin/perl

# yarl_concurrency under a capped template: every key (here the `k` argument) has a cap of
# its own, cluster-wide, with no quota created per key. A key new to this nginx runs on the
# template's own slots until the roots answer for it; another key is not held up by it
# beyond that; the RateLimit fields name the template with the key as partition; yarl_stats
# adds the keys' figures into the template's row.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Socket::INET;
use Test::More;
use Test::Yarl qw(http_get status_of header_of);

my $t = Test::Yarl->new();
$t->write_file('small.html', "hello\n");
$t->write_file('big.html', 'x' x (64 * 1024));
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_zone 8m;
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        add_header X-Yarl-Status $yarl_status always;
        location /slow/ {
            yarl_concurrency gen_$arg_k;
            proxy_pass http://127.0.0.1:%%PORT_8081%%/;
            proxy_buffering off;
        }
        location /fast/ { alias %%TESTDIR%%/; yarl_concurrency gen_$arg_k; yarl_headers on; }
        location = /stats { yarl_stats; }
    }
    server {
        listen 127.0.0.1:%%PORT_8081%%;
        root %%TESTDIR%%;
        limit_rate 8k;
    }
EOF2
$t->run_root('A');
$t->run();
my $p = $t->port(8080);
my ($st) = $t->admin('POST', '/v1/quotas:batch', [ { name => 'gen_*', max_in_flight => 1 } ]);
is($st, 200, 'a template with max_in_flight 1');

sub row {
	my $q = ($t->stats($p) // {})->{concurrency}{quotas} // [];
	return (grep { $_->{quota} eq 'gen_*' } @$q)[0] // {};
}
ok($t->wait_for(sub { (row()->{share} // 0) >= 1 }, 10),
	'nginx holds a share of the template\'s own counter');

sub slow_client {
	my ($key) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $p, Proto => 'tcp')
		or die "connect: $!\n";
	print $s "GET /slow/big.html?k=$key HTTP/1.0\r\nHost: localhost\r\n\r\n";
	my $line = <$s>;
	return ($s, $line);
}

# A key never seen: admitted at once, on the template's slot.
my ($ca, $la) = slow_client('alice');
like($la, qr/ 200 /, 'a new key runs its first request at once');
my $r = http_get($p, '/fast/small.html?k=alice');
is(status_of($r), 429, 'its second, while the first runs, is over its cap of 1');
like(header_of($r, 'RateLimit-Policy') // '',
	qr/^"gen_\*";q=1;qu="concurrent-requests";pk=:[A-Za-z0-9+\/]+=*:$/,
	'RateLimit-Policy: the template\'s cap, the key as partition');
like(header_of($r, 'RateLimit') // '', qr/^"gen_\*";r=0;t=1;pk=:/, 'RateLimit: none left');
# Another key has its own cap: once the roots answered for it (a round or so), it runs
# beside alice's.
ok($t->wait_for(sub { status_of(http_get($p, '/fast/small.html?k=bob')) == 200 }, 5),
	'another key is not held by the first');
my ($cb, $lb) = slow_client('bob');
like($lb, qr/ 200 /, 'both keys run a slow request at once');
my $c = row();
# alice's request runs on the template's own slot and counts on her key too.
is($c->{in_flight}, 3, 'yarl_stats: the template\'s row adds up its keys\' and its own');
cmp_ok($c->{keys} // 0, '>=', 2, 'yarl_stats: and counts the keys');
is(status_of(http_get($p, '/fast/small.html?k=bob')), 429, 'bob is at his cap too');
close($ca);
ok($t->wait_for(sub { status_of(http_get($p, '/fast/small.html?k=alice')) == 200 }, 5),
	'alice\'s slot is hers again once her request ended');
close($cb);
ok($t->wait_for(sub { (row()->{in_flight} // 1) == 0 }, 5), 'nothing left in flight');

# A name that is not under the template passes uncapped.
is(status_of(http_get($p, '/fast/small.html')), 200, 'the bare prefix is no key: uncapped');

$t->finish();
done_testing();
